"""What is computed: Qwen3-MoE, DeepSeek-V3/V3.2 and GLM-5 stages built from vpp.parallel parts.

* :func:`build_stage` / :func:`load_stage` -- a :class:`Stage` (a contiguous layer range) from a
  Hugging Face config.json, with weights from a model directory or any name -> tensor callable.
* :func:`random_checkpoint` / :func:`save_checkpoint` -- deterministic random weights in HF naming,
  and writing them as a model directory (no transformers needed at run time).
* :data:`TINY_CONFIGS` -- real configurations of each family shrunk to run on a CPU.
"""

from vpp.models.build import (
    FAMILIES, build_stage, checkpoint_shapes, load_stage, load_weights, model_config, random_checkpoint,
    save_checkpoint, stage_starts,
)
from vpp.models.checkpoint import RandomCheckpoint, SafetensorsCheckpoint, WeightSource
from vpp.config import SUPPORTED_MODEL_TYPES
from vpp.models.registry import BUILTIN, ModelSource, open_model, snap_partition
from vpp.models.stage import Stage
from vpp.models.tiny import TINY_CONFIGS

__all__ = [
    "BUILTIN", "ModelSource", "open_model", "snap_partition",
    "SUPPORTED_MODEL_TYPES", "FAMILIES", "Stage", "build_stage", "load_stage", "load_weights", "model_config",
    "checkpoint_shapes", "stage_starts", "random_checkpoint", "save_checkpoint", "RandomCheckpoint",
    "SafetensorsCheckpoint", "WeightSource", "TINY_CONFIGS",
]
