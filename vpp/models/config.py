"""Reading a Hugging Face ``config.json`` into a plain dict, with the family's class defaults filled
in for keys the file leaves out (transformers does the same through its config classes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

SUPPORTED_MODEL_TYPES = ("qwen3_moe", "deepseek_v3", "deepseek_v32", "glm_moe_dsa")

Config = dict[str, Any]


def load_config(config: Mapping[str, Any] | str | Path) -> Config:
    """A config dict (copied), a ``config.json`` path, or a model directory holding one."""
    if isinstance(config, Mapping):
        cfg = dict(config)
    else:
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json at {path}")
        cfg = json.loads(path.read_text())
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type={model_type!r} is not supported; supported model types: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    return cfg


def with_defaults(cfg: Mapping[str, Any], defaults: Mapping[str, Any]) -> Config:
    """``defaults`` overridden by every key the config gives (an explicit null stays null)."""
    return {**defaults, **cfg}


def check_layer_range(layer_range: tuple[int, int], num_layers: int) -> tuple[int, int]:
    start, end = (int(layer_range[0]), int(layer_range[1]))
    if not 0 <= start < end <= num_layers:
        raise ValueError(f"layer_range=[{start}, {end}) is not a non-empty range inside "
                         f"num_hidden_layers={num_layers}")
    return start, end
