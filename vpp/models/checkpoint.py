"""Unsharded checkpoints in Hugging Face naming: reading (each rank reads only the tensors, and the
slices of them, that its stage, TP shard and experts need), random weights, and writing.

A *weight source* maps a checkpoint name to the full, unsharded tensor (``source(name)``) and can
read just a shard of it (``source.read(name, shard)``): :class:`SafetensorsCheckpoint` reads slices
from disk with ``safe_open(...).get_slice`` (dequantizing FP8 block-quantized weights slice by
slice); any plain ``Callable[[str], Tensor]`` (such as :func:`~vpp.models.build.random_checkpoint`) narrows the full
tensor.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save

from vpp.config import quantization, read_config
from vpp.models import fp8
from vpp.safe_write import atomic_open
from vpp.models.safetensors_files import (FLOAT_DTYPES, INDEX, CheckpointError, TensorInfo, checkpoint_digest,
                                         read_header, read_index)
from vpp.parallel.sharding import Shard

SCALE = "_scale_inv"  # X.weight_scale_inv: the block scales of the FP8 weight X.weight
SUPPORTED_WEIGHTS = ("supported: bf16/fp16/fp32 weights, or FP8 block-quantized ones (float8_e4m3fn X.weight with "
                     "float32 X.weight_scale_inv and quantization_config.quant_method 'fp8' in config.json)")

Shapes = dict[str, tuple[int, ...]]


class WeightSource:
    """Full checkpoint tensors by name; ``names()`` is None when the source cannot list them,
    ``shape(name)`` None when it cannot tell a tensor's shape without reading it. ``where`` names
    the source in errors."""

    where = "checkpoint"

    def __call__(self, name: str) -> torch.Tensor:
        raise NotImplementedError

    def names(self) -> set[str] | None:
        return None

    def shape(self, name: str) -> tuple[int, ...] | None:
        return None

    def read(self, name: str, shard: Shard | None = None) -> torch.Tensor:
        full = self(name)
        return full if shard is None else shard.narrow(full)

    def identity(self) -> str | None:
        """A digest of the weights, the same wherever they are read (None: this source cannot tell)."""
        return None


class FunctionSource(WeightSource):
    def __init__(self, fn: Callable[[str], torch.Tensor]):
        self.fn = fn

    def __call__(self, name: str) -> torch.Tensor:
        return self.fn(name)


def as_source(weights: Callable[[str], torch.Tensor]) -> WeightSource:
    return weights if isinstance(weights, WeightSource) else FunctionSource(weights)


class SafetensorsCheckpoint(WeightSource):
    """The safetensors of a model directory (``model.safetensors``, or ``model.safetensors.index.json``
    and the shards it names), read by slice.

    FP8 block-quantized weights (see :mod:`vpp.models.fp8`) are recognised from the files: a tensor
    ``X.weight`` with a partner ``X.weight_scale_inv``. :meth:`read` returns their real values
    (float32) for just the slice asked for, reading only that slice of the FP8 data and the scale
    blocks that cover it; other tensors come back in their file dtype. The block size comes from
    ``quantization`` (:func:`vpp.config.quantization`; by default read from the directory's
    ``config.json``). Layouts vpp cannot load raise a :class:`CheckpointError` naming the file and
    tensor: int8 weights with ``weight_scale`` / ``weight_offset`` (Ascend W8A8), any integer
    weight, a float8 weight without its scale, a scale of the wrong shape or dtype, scales without a
    ``quantization_config``.

    ``bytes_read[name]`` counts the bytes of tensor data taken from the files per tensor (slices and
    scale windows included, headers not): the instrument behind the reads-per-rank test.
    """

    def __init__(self, model_dir: str | Path, quantization: dict | None | str = "config"):
        self.dir = Path(model_dir)
        self.where = str(self.dir)
        self.files = read_index(self.dir)
        if quantization == "config":
            quantization = _config_quantization(self.dir)
        self.quantization = quantization
        self.bytes_read: dict[str, int] = {}
        self._headers: dict[str, dict[str, TensorInfo]] = {}
        self._open: dict[str, object] = {}
        self._checked: set[str] = set()
        self._scales = {n: n + SCALE for n in self.files if n + SCALE in self.files}
        ascend = sorted(n for n in self.files if n.endswith((".weight_scale", ".weight_offset")))
        if ascend:
            raise CheckpointError(
                f"{self.dir / self.files[ascend[0]]}: {ascend[0]} ({len(ascend)} weight_scale/weight_offset tensors): "
                f"int8 weights with per-channel scales and offsets (the Ascend W8A8 layout) are not supported; "
                f"{SUPPORTED_WEIGHTS}")

    def identity(self) -> str:
        return checkpoint_digest(self.dir)

    def names(self) -> set[str]:
        """Every tensor of the checkpoint except the scales of quantized weights (read with them)."""
        return set(self.files) - set(self._scales.values())

    def info(self, name: str) -> TensorInfo:
        """dtype and shape of ``name`` as its file's header declares them (no data read)."""
        if name not in self.files:
            raise KeyError(f"{name} is not in the checkpoint at {self.dir}")
        file = self.files[name]
        if file not in self._headers:
            self._headers[file] = read_header(self.dir / file, file)
        header = self._headers[file]
        if name not in header:
            raise CheckpointError(f"{self.dir / file}: does not hold {name}, which the index places there")
        return header[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info(name).shape

    def is_quantized(self, name: str) -> bool:
        return name in self._scales

    def check(self, name: str) -> None:
        """Refuse a tensor vpp cannot load (see the class docstring), from the headers only."""
        if name in self._checked:
            return
        info, where = self.info(name), self.dir / self.files[name]
        scale = self._scales.get(name)
        if scale is not None:
            self._check_quantized(name, info, scale)
        elif info.dtype.startswith("F8_"):
            raise CheckpointError(f"{where}: {name} is {info.dtype} without {name}{SCALE} (its block scales): loaded "
                                  f"unscaled its values would be wrong; {SUPPORTED_WEIGHTS}")
        elif info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{where}: {name} has dtype {info.dtype}: integer-quantized weights are not "
                                  f"supported; {SUPPORTED_WEIGHTS}")
        self._checked.add(name)

    def _check_quantized(self, name: str, info: TensorInfo, scale: str) -> None:
        where, sinfo = self.dir / self.files[name], self.info(scale)
        swhere = self.dir / self.files[scale]
        if self.quantization is None:
            raise CheckpointError(f"{swhere}: {scale} is a block scale, but {self.dir / 'config.json'} has no "
                                  f"quantization_config giving weight_block_size; {SUPPORTED_WEIGHTS}")
        if info.dtype != "F8_E4M3" or len(info.shape) != 2:
            raise CheckpointError(f"{where}: {name} ({info.dtype} {list(info.shape)}) has a block scale {scale}, but "
                                  f"quantized weights must be 2-d F8_E4M3 (float8_e4m3fn); {SUPPORTED_WEIGHTS}")
        block = self.quantization["weight_block_size"]
        want = fp8.scale_shape(info.shape, block)
        if sinfo.dtype not in FLOAT_DTYPES + ("F8_E8M0",) or sinfo.shape != want:
            raise CheckpointError(f"{swhere}: {scale} is {sinfo.dtype} {list(sinfo.shape)}, but {name} "
                                  f"{list(info.shape)} with weight_block_size {block} needs a float "
                                  f"{list(want)} (ceil(out/{block[0]}), ceil(in/{block[1]}))")

    def validate(self) -> dict[str, int]:
        """Read every file's header and :meth:`check` every tensor: what a model directory's files can
        be refused for, without reading tensor data. Returns counts (tensors, quantized, bytes)."""
        names = self.names()
        for name in sorted(names):
            self.check(name)
        return {"tensors": len(names), "quantized": len(self._scales),
                "bytes": sum(self.info(n).nbytes for n in self.files)}

    def _slice(self, name: str, index: tuple[slice, ...]) -> torch.Tensor:
        file = self.files[name]
        if file not in self._open:
            self._open[file] = safe_open(self.dir / file, "pt")
        part = self._open[file].get_slice(name)[index]
        self.bytes_read[name] = self.bytes_read.get(name, 0) + part.numel() * part.element_size()
        return part

    def __call__(self, name: str) -> torch.Tensor:
        return self.read(name)

    def read(self, name: str, shard: Shard | None = None) -> torch.Tensor:
        self.check(name)
        shape = self.info(name).shape
        ranges = [(0, n) for n in shape]
        if shard is not None:
            ranges[shard.dim] = shard.local_range(shape[shard.dim])
        local = self._slice(name, tuple(slice(a, b) for a, b in ranges))
        if name in self._scales:
            block = self.quantization["weight_block_size"]
            windows = [fp8.scale_window(a, b, k) for (a, b), k in zip(ranges, block)]
            scales = self._slice(self._scales[name], tuple(slice(a, b) for a, b in windows))
            local = fp8.dequantize(local, scales, block, (ranges[0][0], ranges[1][0]))
        if shard is not None:
            missing = shard.local_size(shape[shard.dim]) - (ranges[shard.dim][1] - ranges[shard.dim][0])
            if missing:  # padded vocabulary rows
                pad = list(local.shape)
                pad[shard.dim] = missing
                local = torch.cat([local, local.new_zeros(pad)], dim=shard.dim)
        return local


def _config_quantization(model_dir: Path) -> dict | None:
    if not (model_dir / "config.json").is_file():
        return None
    return quantization(read_config(model_dir), str(model_dir / "config.json"))


class RandomCheckpoint(WeightSource):
    """Deterministic random weights: tensor ``name`` depends only on (seed, name), so every TP, PP
    and EP layout built from the same seed holds the same model. Norm weights are 1, biases and
    router correction biases 0, embeddings N(0, 1), other matrices N(0, 1/fan_in)."""

    def __init__(self, shapes: Shapes, seed: int):
        self.shapes, self.seed = dict(shapes), seed
        self.where = f"random weights (seed {seed})"

    def identity(self) -> str:
        return hashlib.blake2b(repr((sorted(self.shapes.items()), self.seed)).encode(), digest_size=12).hexdigest()

    def names(self) -> set[str]:
        return set(self.shapes)

    def shape(self, name: str) -> tuple[int, ...] | None:
        return tuple(self.shapes[name]) if name in self.shapes else None

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
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: not a directory (config.json and model.safetensors are written into one)")
    if (out / INDEX).exists():  # read before model.safetensors: the old shards would be loaded, silently
        raise ValueError(f"{out}: holds {INDEX} of another checkpoint, which loaders read instead of a new "
                         f"model.safetensors; choose another directory")
    tensors = {}
    for name, shape in shapes.items():
        t = get_tensor(name)
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name}: tensor of shape {tuple(t.shape)}, the model expects {tuple(shape)}")
        tensors[name] = t.detach().contiguous().cpu()
    text, blob = json.dumps(config, indent=2), save(tensors, metadata={"format": "pt"})
    out.mkdir(parents=True, exist_ok=True)  # only once every tensor is there: a failed save leaves no folder
    # both files are written in full before either is renamed into place: a failed write (a full disk)
    # leaves the old pair, never new weights beside an old config.json or the other way round
    with atomic_open(out / "model.safetensors", "wb") as weights_file, atomic_open(out / "config.json") as config_file:
        weights_file.write(blob)
        config_file.write(text)
    return out


__all__ = [
    "FunctionSource", "RandomCheckpoint", "SCALE", "SUPPORTED_WEIGHTS", "SafetensorsCheckpoint", "Shapes",
    "WeightSource", "as_source", "save_safetensors",
]
