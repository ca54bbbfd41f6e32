"""Per-request caches that grow chunk by chunk.

Design: every attention module owns one :class:`RequestCache` (its KV cache, keyed by request), so a
stage's caches are exactly its attention modules' caches and freeing a request walks the modules.
Several requests may be in flight at once (cross-request packing runs chunks of two requests on
one stage). Each request's tensors live in :class:`GrowingBuffer` s: appends copy only the new rows,
and capacity doubles when full, so a prefill of n tokens costs O(n) copies in total.
"""

from __future__ import annotations

from typing import Hashable

import torch


class GrowingBuffer:
    """A tensor that grows along ``dim`` with amortised O(1) appends (capacity doubling)."""

    def __init__(self, dim: int = 0):
        self.dim = dim
        self.length = 0
        self._data: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return 0 if self._data is None else self._data.shape[self.dim]

    def append(self, x: torch.Tensor) -> torch.Tensor:
        """Append ``x`` (any length along ``dim``); returns a view of everything stored so far."""
        needed = self.length + x.shape[self.dim]
        if needed > self.capacity:
            shape = list(x.shape)
            shape[self.dim] = max(needed, 2 * self.capacity)
            grown = x.new_empty(shape)
            if self._data is not None:
                grown.narrow(self.dim, 0, self.length).copy_(self.view())
            self._data = grown
        self._data.narrow(self.dim, self.length, x.shape[self.dim]).copy_(x)
        self.length = needed
        return self.view()

    def view(self) -> torch.Tensor:
        assert self._data is not None
        return self._data.narrow(self.dim, 0, self.length)


class RequestCache:
    """The named, equally long buffers of every request in flight on one attention module.

    ``layouts`` maps a part name to the dim it grows along (the token dim), e.g.
    ``{"k": 1, "v": 1}`` for [heads, tokens, head_dim] tensors.
    """

    def __init__(self, owner: str, layouts: dict[str, int]):
        self.owner, self.layouts = owner, dict(layouts)
        self._entries: dict[Hashable, dict[str, GrowingBuffer]] = {}

    def length(self, request: Hashable) -> int:
        entry = self._entries.get(request)
        return 0 if entry is None else next(iter(entry.values())).length

    def append(self, request: Hashable, offset: int, **parts: torch.Tensor) -> dict[str, torch.Tensor]:
        """Append one chunk at token ``offset`` of ``request``; returns every part, prefix included."""
        if set(parts) != set(self.layouts):
            raise ValueError(f"{self.owner}: cache parts {sorted(parts)} != {sorted(self.layouts)}")
        have = self.length(request)
        if offset != have:
            raise ValueError(f"{self.owner}: request {request!r} chunk at offset {offset}, "
                             f"but its cache holds {have} tokens")
        entry = self._entries.setdefault(request, {n: GrowingBuffer(d) for n, d in self.layouts.items()})
        return {name: entry[name].append(x) for name, x in parts.items()}

    def get(self, request: Hashable) -> dict[str, torch.Tensor]:
        """Every stored part of ``request`` (views; empty for an unknown request)."""
        return {name: buf.view() for name, buf in self._entries.get(request, {}).items()}

    def release(self, request: Hashable) -> None:
        self._entries.pop(request, None)

    def requests(self) -> list[Hashable]:
        return list(self._entries)

    def nbytes(self, request: Hashable) -> int:
        entry = self._entries.get(request, {})
        return sum(b._data.nbytes for b in entry.values() if b._data is not None)
