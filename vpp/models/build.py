"""Building a stage from a Hugging Face config, and loading its weights.

``build_stage(config, layer_range, groups)`` builds layers [start, end) of a supported model for
this rank's place in ``groups`` (TP shard, experts); ``load_stage(model_dir, ...)`` also loads the
weights from the model directory's safetensors, reading only this stage's tensors and this rank's
slices of them.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Callable

import torch

from vpp import config as hf
from vpp.config import SUPPORTED_MODEL_TYPES, Config, ConfigLike, check_layer_range, model_config
from vpp.models import deepseek, qwen3_moe
from vpp.models.blocks import Shapes, global_tensors
from vpp.models.checkpoint import (
    RandomCheckpoint, SafetensorsCheckpoint, WeightSource, as_source, save_safetensors,
)
from vpp.models.safetensors_files import CheckpointError
from vpp.models.stage import Stage
from vpp.transformer.attention import RotaryEmbedding
from vpp.parallel.groups import ParallelGroups
from vpp.parallel.sharding import ReadSlice, Shard, SliceLoader, shard_spec_of

FAMILIES = {t: family for family in (qwen3_moe, deepseek) for t in family.MODEL_TYPES}
assert set(FAMILIES) == set(SUPPORTED_MODEL_TYPES)

_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def checkpoint_shapes(config: ConfigLike, layer_range: tuple[int, int] | None = None) -> Shapes:
    """Every checkpoint tensor (HF name -> full shape) of the model, or of one stage's layers."""
    cfg = model_config(config)
    n = cfg["num_hidden_layers"]
    start, end = (0, n) if layer_range is None else check_layer_range(layer_range, n)
    glob = global_tensors(cfg)
    shapes = {k: v for k, v in glob.items() if (k == "model.embed_tokens.weight" and start == 0)
              or (k != "model.embed_tokens.weight" and end == n)}
    if end == n and cfg.get("tie_word_embeddings") and start != 0:
        shapes["model.embed_tokens.weight"] = glob["model.embed_tokens.weight"]  # the tied LM head
    family = FAMILIES[cfg["model_type"]]
    for layer in range(start, end):
        shapes.update(family.layer_tensors(cfg, layer))
    return shapes


def build_stage(config: ConfigLike, layer_range: tuple[int, int], groups: ParallelGroups, *,
                dtype: torch.dtype = torch.float32, device=None, moe_dispatch: str = "allreduce",
                weights: Callable[[str], torch.Tensor] | None = None) -> Stage:
    """Layers [start, end) of the model ``config`` (a dict, a config.json path or a model dir),
    sharded for this rank of ``groups``. With ``weights`` (a checkpoint-name -> full tensor
    callable, e.g. :func:`random_checkpoint`) the parameters are loaded, else left uninitialised."""
    cfg = model_config(config)
    family = FAMILIES[cfg["model_type"]]
    n = cfg["num_hidden_layers"]
    start, end = check_layer_range(layer_range, n)
    if start not in hf.stage_starts(cfg):
        raise ValueError(
            f"a stage cannot start at layer {start}: indexer_types[{start}]={cfg['indexer_types'][start]!r} "
            f"reuses the top-k of layer {start - 1}; stages may start at layers {hf.stage_starts(cfg)}")
    device = device if device is not None else groups.device
    kw = dict(dtype=dtype, device=device)
    layers = {i: family.build_layer(cfg, i, groups, moe_dispatch=moe_dispatch, **kw) for i in range(start, end)}
    rope = RotaryEmbedding(family.rope_spec(cfg), device=device)
    stage = Stage(layers, num_layers=n, hidden_size=cfg["hidden_size"], vocab_size=cfg["vocab_size"], rope=rope,
                  eps=cfg["rms_norm_eps"], groups=groups, config=cfg, **kw)
    if weights is not None:
        source = as_source(weights)
        load_weights(stage, source)
        stage.model_digest, stage.model_name = model_digest(cfg, source), str(source.where)
    return stage


def model_digest(cfg: Config, source: WeightSource) -> str | None:
    """The identity of a model: its config and its weights' digest (:meth:`WeightSource.identity`), the
    same on every rank and for every layout; what ranks agree on and what a KV save carries. None when the
    weights cannot be identified (a plain function of names)."""
    weights = source.identity()
    if weights is None:
        return None
    text = json.dumps(cfg, sort_keys=True, default=str) + weights
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def load_stage(model_dir: str | Path, layer_range: tuple[int, int], groups: ParallelGroups, *,
               dtype: torch.dtype | str = "auto", **kwargs) -> Stage:
    """:func:`build_stage` from ``model_dir/config.json``, loaded from the directory's safetensors
    (FP8 block-quantized weights dequantized slice by slice). ``dtype="auto"``: the config's
    ``torch_dtype`` (float32 when it gives none)."""
    cfg = model_config(model_dir)
    if dtype == "auto":
        dtype = getattr(torch, hf.config_dtype(cfg, str(Path(model_dir) / "config.json")) or "float32")
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    weights = SafetensorsCheckpoint(model_dir, cfg["quantization"])
    return build_stage(cfg, layer_range, groups, weights=weights, dtype=dtype, **kwargs)


def random_checkpoint(config: ConfigLike, seed: int = 0) -> RandomCheckpoint:
    """Deterministic random weights for every checkpoint tensor of the model (see RandomCheckpoint)."""
    return RandomCheckpoint(checkpoint_shapes(config), seed)


def save_checkpoint(config: ConfigLike, get_tensor: Callable[[str], torch.Tensor], out_dir: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (HF naming) for ``get_tensor``'s weights."""
    return save_safetensors(checkpoint_shapes(config), get_tensor, hf.read_config(config), out_dir)


@torch.no_grad()
def load_weights(stage: Stage, source: WeightSource) -> None:
    """Load every parameter of ``stage`` from unsharded checkpoint tensors, reading only this rank's
    slices, one at a time. The MLP blocks (dense or MoE) load themselves (they know their experts'
    names) through the same reader."""
    cfg = stage.config
    expected = checkpoint_shapes(cfg, stage.layer_range)
    check_names(cfg, stage.layer_range, expected, source.names(), source.where)
    loader = SliceLoader(schema_reader(source, expected), f"stage {list(stage.layer_range)}")
    mlp_prefixes = []
    for i, layer in zip(range(*stage.layer_range), stage.model.layers.values()):
        prefix = f"model.layers.{i}.mlp."
        layer.mlp.load_checkpoint(loader.read, prefix)
        mlp_prefixes.append(prefix)
    for name, param in stage.named_parameters():
        if name.startswith(tuple(mlp_prefixes)):
            continue
        ckpt = "model.embed_tokens.weight" if name == "lm_head.weight" and cfg.get("tie_word_embeddings") else name
        if ckpt not in expected:
            raise KeyError(f"parameter {name} has no checkpoint tensor in the model's schema")
        loader.copy(param, ckpt, shard_spec_of(stage, name))
    loader.finish()


def schema_reader(source: WeightSource, expected: Shapes) -> ReadSlice:
    """``read(name, shard)`` over ``source`` for the tensors of the model's schema ``expected``:
    the full shape (from the file's header where the source knows it) must be the schema's."""
    available = source.names()

    def read(name: str, shard: Shard | None) -> torch.Tensor:
        if name not in expected:
            raise ValueError(f"{name} is read by the MLP block but not in the model's schema")
        shape = source.shape(name) if available is None or name in available else None
        if shape is not None and tuple(shape) != tuple(expected[name]):
            raise CheckpointError(f"{source.where}: {name} has shape {list(shape)}, the config describes "
                                  f"{list(expected[name])}")
        return source.read(name, shard)
    return read


def check_names(cfg: Config, layer_range: tuple[int, int], expected: Shapes, available: set[str] | None,
                where: object = "checkpoint") -> None:
    """Missing: expected tensors of this stage that the checkpoint lacks. Unexpected: checkpoint
    tensors of this stage's layers (or outside any layer) that the model does not have. Layers past
    num_hidden_layers are DeepSeek's multi-token-prediction modules, which prefill does not use."""
    if available is None:
        return
    start, end = layer_range
    n = cfg["num_hidden_layers"]
    extra_layers = n + int(cfg.get("num_nextn_predict_layers") or 0)
    known_globals = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    unexpected = []
    for name in available:
        m = _LAYER.match(name)
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if m is None:
            if name not in known_globals:
                unexpected.append(name)
        elif start <= int(m.group(1)) < end and name not in expected:
            unexpected.append(name)
        elif int(m.group(1)) >= extra_layers:
            unexpected.append(name)
    missing = sorted(set(expected) - available)
    if missing or unexpected:
        raise CheckpointError(f"{where}: checkpoint does not match {cfg['model_type']} layers [{start}, {end}): "
                         f"{_listing(missing)} missing, {_listing(sorted(unexpected))} unexpected")


def _listing(names: list[str], show: int = 8) -> str:
    if not names:
        return "0 tensors"
    more = f", ... ({len(names) - show} more)" if len(names) > show else ""
    return f"{len(names)} tensors ({', '.join(names[:show])}{more})"


__all__ = [
    "FAMILIES", "build_stage", "check_names", "checkpoint_shapes", "load_stage", "load_weights", "model_digest",
    "random_checkpoint", "save_checkpoint", "schema_reader",
]
