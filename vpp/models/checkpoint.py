"""Unsharded checkpoints in Hugging Face naming: reading (each rank reads only the tensors, and the
slices of them, that its stage, TP shard and experts need), random weights, and writing.

A *weight source* maps a checkpoint name to the full, unsharded tensor (``source(name)``) and can
read just a shard of it (``source.read(name, shard)``): :class:`SafetensorsCheckpoint` reads slices
from disk with ``safe_open(...).get_slice``; any plain ``Callable[[str], Tensor]`` (such as
:func:`random_checkpoint`) narrows the full tensor.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vpp.parallel.sharding import Shard

Shapes = dict[str, tuple[int, ...]]


class WeightSource:
    """Full checkpoint tensors by name; ``names()`` is None when the source cannot list them."""

    def __call__(self, name: str) -> torch.Tensor:
        raise NotImplementedError

    def names(self) -> set[str] | None:
        return None

    def read(self, name: str, shard: Shard | None = None) -> torch.Tensor:
        full = self(name)
        return full if shard is None else shard.narrow(full)


class FunctionSource(WeightSource):
    def __init__(self, fn: Callable[[str], torch.Tensor]):
        self.fn = fn

    def __call__(self, name: str) -> torch.Tensor:
        return self.fn(name)


def as_source(weights: Callable[[str], torch.Tensor]) -> WeightSource:
    return weights if isinstance(weights, WeightSource) else FunctionSource(weights)


class SafetensorsCheckpoint(WeightSource):
    """``model.safetensors``, or ``model.safetensors.index.json`` and the shards it names."""

    def __init__(self, model_dir: str | Path):
        self.dir = Path(model_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.is_file():
            self.files = dict(json.loads(index.read_text())["weight_map"])
        elif (self.dir / "model.safetensors").is_file():
            with safe_open(self.dir / "model.safetensors", "pt") as f:
                self.files = {name: "model.safetensors" for name in f.keys()}
        else:
            raise FileNotFoundError(f"{self.dir} has neither model.safetensors nor model.safetensors.index.json")
        self._open: dict[str, object] = {}

    def names(self) -> set[str]:
        return set(self.files)

    def _handle(self, name: str):
        if name not in self.files:
            raise KeyError(f"{name} is not in the checkpoint at {self.dir}")
        file = self.files[name]
        if file not in self._open:
            self._open[file] = safe_open(self.dir / file, "pt")
        return self._open[file]

    def __call__(self, name: str) -> torch.Tensor:
        return self._handle(name).get_tensor(name)

    def read(self, name: str, shard: Shard | None = None) -> torch.Tensor:
        if shard is None:
            return self(name)
        part = self._handle(name).get_slice(name)
        shape = part.get_shape()
        start, end = shard.local_range(shape[shard.dim])
        index = tuple(slice(start, end) if d == shard.dim else slice(None) for d in range(len(shape)))
        local = part[index]
        missing = shard.local_size(shape[shard.dim]) - (end - start)
        if missing:  # padded vocabulary rows
            pad = list(local.shape)
            pad[shard.dim] = missing
            local = torch.cat([local, local.new_zeros(pad)], dim=shard.dim)
        return local


class RandomCheckpoint(WeightSource):
    """Deterministic random weights: tensor ``name`` depends only on (seed, name), so every TP, PP
    and EP layout built from the same seed holds the same model. Norm weights are 1, biases and
    router correction biases 0, embeddings N(0, 1), other matrices N(0, 1/fan_in)."""

    def __init__(self, shapes: Shapes, seed: int):
        self.shapes, self.seed = dict(shapes), seed

    def names(self) -> set[str]:
        return set(self.shapes)

    def __call__(self, name: str) -> torch.Tensor:
        if name not in self.shapes:
            raise KeyError(f"{name} is not a tensor of this model")
        shape = self.shapes[name]
        if name.endswith("norm.weight"):
            return torch.ones(shape)
        if name.endswith("bias"):  # biases and the router correction bias
            return torch.zeros(shape)
        digest = hashlib.sha256(f"{self.seed}/{name}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
        std = 1.0 if name.endswith("embed_tokens.weight") else shape[-1] ** -0.5
        return torch.randn(shape, generator=gen) * std


def save_safetensors(shapes: Shapes, get_tensor: Callable[[str], torch.Tensor], config: dict,
                     out_dir: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (every name of ``shapes``) into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, shape in shapes.items():
        t = get_tensor(name)
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name}: tensor of shape {tuple(t.shape)}, the model expects {tuple(shape)}")
        tensors[name] = t.detach().contiguous().cpu()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
