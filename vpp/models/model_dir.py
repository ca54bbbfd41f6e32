"""Checking a model directory before any rank starts: config.json, the shard index and every
safetensors header, without reading tensor data.

:func:`check_model_dir` is what a launcher calls in its parent process (``vpp prefill`` does), so
that a checkpoint vpp cannot load fails once, in one line naming the file and the key or tensor,
instead of on every rank after the processes started. The ranks check the same things again for
the tensors they read (a library user may skip this step).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vpp.config import config_dtype, model_config
from vpp.models.build import check_names, checkpoint_shapes
from vpp.models.checkpoint import SafetensorsCheckpoint
from vpp.models.safetensors_files import CheckpointError


@dataclass(frozen=True)
class ModelDirSummary:
    model_type: str
    num_layers: int
    tensors: int
    quantized: int  # FP8 block-quantized weights
    bytes: int  # tensor data in the files
    dtype: str | None  # the config's torch_dtype / dtype


def check_model_dir(path: str | Path, *, dtype: str = "auto") -> ModelDirSummary:
    """Refuse a model directory vpp cannot load, from its metadata only:

    * config.json: missing, malformed (path and position), not an object, an unsupported
      ``model_type``, a shape key missing, a quantization method other than FP8 block scales, and
      (``dtype="auto"``) a ``torch_dtype`` vpp does not run in -- :class:`vpp.config.ConfigError`;
    * the index: malformed, an entry pointing outside the directory, a missing shard; every
      safetensors header: truncated or garbage files; tensors: missing or unexpected for the config,
      a shape other than the config's, int8 / Ascend W8A8 weights, float8 weights without scales,
      scales of the wrong shape -- :class:`CheckpointError`.
    """
    where = Path(path)
    cfg = model_config(where)
    declared = config_dtype(cfg, str(where / "config.json")) if dtype == "auto" else None
    ckpt = SafetensorsCheckpoint(where, cfg["quantization"])
    counts = ckpt.validate()
    n = cfg["num_hidden_layers"]
    expected = checkpoint_shapes(cfg)
    check_names(cfg, (0, n), expected, ckpt.names(), where)
    for name, shape in expected.items():
        info = ckpt.info(name)
        if tuple(info.shape) != tuple(shape):
            raise CheckpointError(f"{where / info.file}: {name} has shape {list(info.shape)}, the config describes "
                                  f"{list(shape)}")
    return ModelDirSummary(cfg["model_type"], n, counts["tensors"], counts["quantized"], counts["bytes"], declared)


__all__ = ["ModelDirSummary", "check_model_dir"]
