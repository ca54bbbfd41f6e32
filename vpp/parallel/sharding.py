"""How a parameter is split over a group, so an unsharded checkpoint tensor can be narrowed to this
rank's shard at load time (any TP/EP/PP layout loads the same files).

A module that shards parameters lists them in ``self.shard_specs: dict[str, Shard]`` (local
parameter name -> :class:`Shard`); parameters it does not list are replicated. The spec lives on the
module, never on the tensor.

Modules that load themselves from a checkpoint (the MLP blocks) take a :data:`ReadSlice`,
``read(name, shard)``: this rank's slice of the unsharded checkpoint tensor ``name`` (the whole
tensor for ``shard=None``). A checkpoint reader passes one that reads just the slice from disk;
:func:`narrowing` turns any name -> full tensor callable into one (tests, random weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


def split_size(total: int, parts: int, what: str = "size") -> int:
    """``total // parts``, or an error with the numbers when it does not divide."""
    if total % parts:
        raise ValueError(f"{what}={total} is not divisible by {parts} ranks")
    return total // parts


@dataclass(frozen=True)
class Shard:
    """Rank ``index`` of ``parts`` holds the ``index``-th equal slice of dim ``dim``.

    With ``pad=True`` the full size is rounded up to a multiple of ``parts`` and the last slices
    are zero-padded (vocabulary dims); otherwise the size must divide.
    """

    dim: int
    index: int
    parts: int
    pad: bool = False

    def local_size(self, full_size: int) -> int:
        if self.pad:
            return -(-full_size // self.parts)
        return split_size(full_size, self.parts, f"dim {self.dim} size")

    def local_range(self, full_size: int) -> tuple[int, int]:
        """[start, end) of this rank's slice in the unpadded full dimension."""
        size = self.local_size(full_size)
        start = min(self.index * size, full_size)
        return start, min(start + size, full_size)

    def narrow(self, full: torch.Tensor) -> torch.Tensor:
        start, end = self.local_range(full.shape[self.dim])
        part = full.narrow(self.dim, start, end - start)
        missing = self.local_size(full.shape[self.dim]) - (end - start)
        if missing:
            pad_shape = list(full.shape)
            pad_shape[self.dim] = missing
            part = torch.cat([part, full.new_zeros(pad_shape)], dim=self.dim)
        return part


ReadSlice = Callable[[str, "Shard | None"], torch.Tensor]


def narrowing(get_tensor: Callable[[str], torch.Tensor]) -> ReadSlice:
    """A :data:`ReadSlice` over whole tensors ``get_tensor(name)``, narrowed in memory."""
    def read(name: str, shard: Shard | None) -> torch.Tensor:
        full = get_tensor(name)
        return full if shard is None else shard.narrow(full)
    return read


class SliceLoader:
    """Copies checkpoint slices into parameters one at a time (the host holds one slice at once),
    and collects the names of missing tensors so that :meth:`finish` raises one KeyError naming
    them all. ``what`` names the block in errors."""

    def __init__(self, read: ReadSlice, what: str):
        self.read, self.what = read, what
        self.missing: list[str] = []
        self.names: list[str] = []

    @torch.no_grad()
    def copy(self, dest: torch.Tensor, name: str, shard: Shard | None = None) -> None:
        self.names.append(name)
        try:
            local = self.read(name, shard)
        except KeyError:
            self.missing.append(name)
            return
        if local.shape != dest.shape:
            where = "" if shard is None else f" (slice {shard.index} of {shard.parts} along dim {shard.dim})"
            raise ValueError(f"{name}: checkpoint gives {tuple(local.shape)}{where}, expected {tuple(dest.shape)}")
        dest.copy_(local)

    def finish(self) -> None:
        if self.missing:
            shown = ", ".join(self.missing[:6]) + (f", ... ({len(self.missing) - 6} more)" if len(self.missing) > 6 else "")
            raise KeyError(f"{self.what}: checkpoint is missing {len(self.missing)} of {len(self.names)} tensors: {shown}")


def shard_spec_of(model: nn.Module, param_name: str) -> Shard | None:
    """The :class:`Shard` that the owning module declares for ``param_name`` (None: replicated)."""
    owner_name, _, local = param_name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    return getattr(owner, "shard_specs", {}).get(local)


@torch.no_grad()
def load_param(model: nn.Module, param_name: str, full: torch.Tensor) -> None:
    """Copy the unsharded tensor ``full`` into ``param_name``, narrowed to this rank's shard."""
    param = model.get_parameter(param_name)
    spec = shard_spec_of(model, param_name)
    local = spec.narrow(full) if spec is not None else full
    if local.shape != param.shape:
        raise ValueError(
            f"{param_name}: checkpoint tensor of shape {tuple(full.shape)} gives a shard of "
            f"{tuple(local.shape)}, but the parameter is {tuple(param.shape)}"
        )
    param.copy_(local)


def load_state(model: nn.Module, get_tensor: Callable[[str], torch.Tensor]) -> None:
    """Load every parameter of ``model`` from ``get_tensor(name)`` (unsharded tensors)."""
    for name, _ in model.named_parameters():
        load_param(model, name, get_tensor(name))


__all__ = [
    "ReadSlice", "Shard", "SliceLoader", "load_param", "load_state", "narrowing", "shard_spec_of",
    "split_size",
]
