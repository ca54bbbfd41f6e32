"""What is computed: Qwen3-MoE, DeepSeek-V3/V3.2 and GLM-5 stages built from vpp.parallel parts.

* :func:`build_stage` / :func:`load_stage` -- a :class:`Stage` (a contiguous layer range) from a
  Hugging Face config.json, with weights from a model directory or any name -> tensor callable.
* :func:`random_checkpoint` / :func:`save_checkpoint` -- deterministic random weights in HF naming,
  and writing them as a model directory (no transformers needed at run time).
* :data:`TINY_CONFIGS` -- real configurations of each family shrunk to run on a CPU.
* :func:`check_model_dir` -- refuse a model directory vpp cannot load (config, index, headers; no
  tensor data), in one line, before any rank starts. FP8 block-quantized checkpoints (the official
  DeepSeek-V3/V3.1/V3.2 and Qwen3 FP8 releases) load, dequantized slice by slice into the run dtype.
* :func:`load_tokenizer` / :func:`text_prompt` -- a checkpoint's own tokenizer (``tokenizer.json``,
  the optional ``tokenizers`` package) for text prompts.
"""

from vpp.models.build import (
    FAMILIES, build_stage, checkpoint_shapes, load_stage, load_weights, random_checkpoint, save_checkpoint,
)
from vpp.models.checkpoint import RandomCheckpoint, SafetensorsCheckpoint, WeightSource
from vpp.config import SUPPORTED_MODEL_TYPES, model_config, stage_starts
from vpp.models.model_dir import ModelDirSummary, check_model_dir
from vpp.models.registry import BUILTIN, ModelSource, check_model, open_model, resolve_dtype, snap_partition
from vpp.models.safetensors_files import CheckpointError
from vpp.models.tokenizer import TextTokenizer, TokenizerError, load_tokenizer, prompt_ids, text_prompt
from vpp.models.stage import Stage
from vpp.models.tiny import TINY_CONFIGS

__all__ = [
    "BUILTIN", "ModelSource", "open_model", "snap_partition", "check_model", "check_model_dir", "ModelDirSummary",
    "resolve_dtype", "CheckpointError", "TextTokenizer", "TokenizerError", "load_tokenizer", "text_prompt", "prompt_ids",
    "SUPPORTED_MODEL_TYPES", "FAMILIES", "Stage", "build_stage", "load_stage", "load_weights", "model_config",
    "checkpoint_shapes", "stage_starts", "random_checkpoint", "save_checkpoint", "RandomCheckpoint",
    "SafetensorsCheckpoint", "WeightSource", "TINY_CONFIGS",
]
