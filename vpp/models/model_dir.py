"""Checking a model directory before any rank starts: config.json, the shard index and every
safetensors header, without reading tensor data.

:func:`check_model_dir` is what a launcher calls in its parent process (``vpp prefill`` does), so
that a checkpoint vpp cannot load fails once, in one line naming the file and the key or tensor,
instead of on every rank after the processes started. The ranks check the same things again for
the tensors they read (a library user may skip this step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from vpp.config import (DEFAULTS, RELEASE_DEFAULTS, REQUIRED, ConfigError, check_types, config_dtype, model_config,
                        read_config)
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
    raw = read_config(where)
    ckpt = SafetensorsCheckpoint(where)  # the index and the headers: what the files hold
    check_counts(raw, ckpt.names(), where)  # before anything is built per layer or expert
    cfg = model_config(where)
    declared = config_dtype(cfg, str(where / "config.json")) if dtype == "auto" else None
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


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.")


def check_counts(raw: dict, names, where: Path) -> None:
    """The config's types and ranges (:func:`vpp.config.check_types`), and its layer and expert counts
    against what the checkpoint's headers hold (``names``): a config claiming more layers or experts than
    the files hold is one :class:`ConfigError` naming the key and the file, before any per-layer list."""
    config = where / "config.json"
    family = raw.get("model_type")
    experts_key = "num_experts" if family == "qwen3_moe" else "n_routed_experts"
    given = dict(raw)
    if "num_local_experts" in given:
        given.setdefault(experts_key, given["num_local_experts"])
    for key in ("num_hidden_layers", experts_key):
        if key in given and (isinstance(given[key], bool) or not isinstance(given[key], int) or given[key] < 1):
            raise ConfigError(f"{config}: {key}={given[key]!r} must be a positive integer")
    layers = {int(m.group(1)) for n in names if (m := _LAYER.match(n))}
    experts = {int(m.group(1)) for n in names if (m := _EXPERT.search(n))}
    held = {"num_hidden_layers": (max(layers) + 1 if layers else 0, "layers"),
            experts_key: (max(experts) + 1 if experts else 0, "experts per layer")}
    for key, (count, what) in held.items():
        value = given.get(key)
        if isinstance(value, int) and value > count:
            raise ConfigError(f"{config}: {key}={value}, but the checkpoint's safetensors headers hold {count} {what}")
    if family in REQUIRED and not [k for k in REQUIRED[family] if k not in given]:
        check_types({**RELEASE_DEFAULTS[family], **DEFAULTS[family], **given}, str(config))


__all__ = ["ModelDirSummary", "check_counts", "check_model_dir"]
