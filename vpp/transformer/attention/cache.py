"""Per-request caches, allocated once at the length a request will reach.

Design: every attention module owns one :class:`RequestCache` (its KV cache, keyed by request), so a
stage's caches are exactly its attention modules' caches and freeing a request walks the modules.
Several requests may be in flight at once (cross-request packing runs chunks of two requests on one
stage; decoding appends one token per step to many requests' caches).

Sizing. :meth:`RequestCache.reserve` records how many tokens a request will reach (its prompt, or
prompt plus the tokens to be decoded); its first append then allocates exactly that many rows, on the
appended tensor's device and dtype, and later appends only copy their own rows: no reallocation, no
spare capacity. Appends beyond the reservation (or without one) still work: the buffer grows to
``max(needed, 2 x capacity)``, amortised O(1) per token, so a caller that under-reserved pays copies
and up to 2x memory, never an error.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch


class GrowingBuffer:
    """A tensor that grows along ``dim``: exactly ``reserved`` rows at the first append (when given),
    then capacity doubling for appends beyond it."""

    def __init__(self, dim: int = 0, reserved: int = 0):
        self.dim = dim
        self.length = 0
        self.reserved = reserved
        self._data: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return 0 if self._data is None else self._data.shape[self.dim]

    @property
    def nbytes(self) -> int:
        """Bytes allocated (capacity, not length)."""
        return 0 if self._data is None else self._data.nbytes

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` rows in all: sets the size of the first allocation, or grows an
        existing buffer to exactly ``rows`` (one copy) if it is smaller. Never shrinks."""
        self.reserved = max(self.reserved, rows)
        if self._data is not None and rows > self.capacity:
            self._resize(rows)

    def append(self, x: torch.Tensor) -> torch.Tensor:
        """Append ``x`` (any length along ``dim``); returns a view of everything stored so far."""
        needed = self.length + x.shape[self.dim]
        if self._data is None:
            shape = list(x.shape)
            shape[self.dim] = max(needed, self.reserved)
            self._data = x.new_empty(shape)
        elif needed > self.capacity:
            self._resize(max(needed, 2 * self.capacity))
        self._data.narrow(self.dim, self.length, x.shape[self.dim]).copy_(x)
        self.length = needed
        return self.view()

    def _resize(self, rows: int) -> None:
        shape = list(self._data.shape)
        shape[self.dim] = rows
        grown = self._data.new_empty(shape)
        grown.narrow(self.dim, 0, self.length).copy_(self.view())
        self._data = grown

    def view(self) -> torch.Tensor:
        assert self._data is not None
        return self._data.narrow(self.dim, 0, self.length)


class RequestCache:
    """The named, equally long buffers of every request in flight on one attention module.

    ``layouts`` maps a part name to the dim it grows along (the token dim), e.g.
    ``{"k": 1, "v": 1}`` for [heads, tokens, head_dim] tensors. ``slices`` says, for the parts that
    hold a slice of the full (unsharded) tensor, ``(dim, start, end, full)``: this rank holds entries
    ``[start, end)`` of ``full`` along ``dim`` (GQA: its KV heads); parts not listed are whole
    (replicated over TP). A KV hand-over between layouts reads it. ``shapes`` gives each part's shape
    on this rank with None at the token dim (GQA: ``(local KV heads, None, head_dim)``): what a
    hand-over or a load checks the tensors it installs against, so that another model's are refused.
    """

    def __init__(self, owner: str, layouts: dict[str, int],
                 slices: dict[str, tuple[int, int, int, int]] | None = None,
                 shapes: dict[str, tuple[int | None, ...]] | None = None):
        self.owner, self.layouts = owner, dict(layouts)
        self.slices = dict(slices or {})
        self.shapes = dict(shapes or {})
        self._entries: dict[Hashable, dict[str, GrowingBuffer]] = {}

    def length(self, request: Hashable) -> int:
        entry = self._entries.get(request)
        return 0 if entry is None else next(iter(entry.values())).length

    def _entry(self, request: Hashable) -> dict[str, GrowingBuffer]:
        return self._entries.setdefault(request, {n: GrowingBuffer(d) for n, d in self.layouts.items()})

    def reserve(self, request: Hashable, tokens: int) -> None:
        """``request`` will hold ``tokens`` tokens in all (never shrinks what is reserved)."""
        if tokens < 0:
            raise ValueError(f"{self.owner}: cannot reserve {tokens} tokens for request {request!r}")
        for buf in self._entry(request).values():
            buf.reserve(tokens)

    def append(self, request: Hashable, offset: int, **parts: torch.Tensor) -> dict[str, torch.Tensor]:
        """Append one chunk at token ``offset`` of ``request``; returns every part, prefix included."""
        if set(parts) != set(self.layouts):
            raise ValueError(f"{self.owner}: cache parts {sorted(parts)} != {sorted(self.layouts)}")
        have = self.length(request)
        if offset != have:
            raise ValueError(f"{self.owner}: request {request!r} chunk at offset {offset}, "
                             f"but its cache holds {have} tokens")
        entry = self._entry(request)
        return {name: entry[name].append(x) for name, x in parts.items()}

    def get(self, request: Hashable) -> dict[str, torch.Tensor]:
        """Every stored part of ``request`` (views; empty for an unknown request or one only reserved)."""
        return {name: buf.view() for name, buf in self._entries.get(request, {}).items() if buf.length}

    def release(self, request: Hashable) -> None:
        self._entries.pop(request, None)

    def requests(self) -> list[Hashable]:
        """Requests with cached tokens (a reservation alone does not count)."""
        return [q for q, entry in self._entries.items() if next(iter(entry.values())).length]

    def nbytes(self, request: Hashable | None = None) -> int:
        """Bytes allocated for ``request``'s cache, or for every request's (None)."""
        entries = self._entries.values() if request is None else [self._entries.get(request, {})]
        return sum(b.nbytes for entry in entries for b in entry.values())



def shape_problem(name: str, shape: Sequence[int], dtype: str, expected: Sequence[int | None], expected_dtype: str,
                  *, sliced_dim: int | None = None) -> str | None:
    """Why the cache tensor ``name`` of ``shape`` and ``dtype`` (a name: ``"float32"``) cannot become caches
    whose shape is ``expected`` (None at the token dim) and dtype ``expected_dtype``, or None: another
    model's (other widths, heads, dtype). ``sliced_dim``: a dim along which the two hold different
    slices of the full tensor (not compared here: :func:`vpp.kv.transfer_plan.plan_transfers` checks the slicing)."""
    dtype, expected_dtype = str(dtype).removeprefix("torch."), str(expected_dtype).removeprefix("torch.")
    same = len(shape) == len(expected) and all(e is None or i == sliced_dim or int(n) == e
                                               for i, (n, e) in enumerate(zip(shape, expected)))
    if same and dtype == expected_dtype:
        return None
    want = ", ".join("tokens" if e is None else "any" if i == sliced_dim else str(e) for i, e in enumerate(expected))
    got = ", ".join(str(int(n)) for n in shape)
    return f"{name} is [{got}] {dtype}, but its caches here are [{want}] {expected_dtype}"

__all__ = ["shape_problem", "GrowingBuffer", "RequestCache"]
