"""Which rank sends which slice of a request's caches to which rank, when a prefill instance hands a
request over to a decode instance of another layout (pure Python: no process group, no tensor).

Every cache tensor of a request is named as in ``Stage.export_cache``
(``model.layers.{i}.self_attn.{part}``) and is, on any rank, either the whole tensor (replicated over
TP: MLA's latent, DSA's indexer keys) or a slice ``[start, end)`` of one dim of the full tensor (GQA's
K/V: a range of KV heads along dim 0; with more TP ranks than KV heads, several ranks hold the same
heads). A :class:`Piece` says which. The sources list the pieces every sending rank holds; the
destinations list the pieces every receiving rank needs (its layers, its heads).

:func:`plan_transfers` cuts each needed piece at the sources' slice boundaries and takes every cut
from exactly one source that holds it, so each byte a destination needs arrives once and no
destination gets a byte it does not need. Among several sources of a cut (a replicated tensor, a
replicated head) it picks ``sources[k % n]``, ``k`` the destination's index, so the sending is spread
over the prefill's TP ranks; adjacent cuts from the same source merge into one transfer. The order
of the returned transfers is the order both sides post them.

The same plan writes and reads the directory form (:mod:`vpp.kv.files`): a writer is the plan
to one destination that needs every full tensor (each byte written once), and a reader is the plan
from the slices in the files to the reading rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Piece:
    """A cache tensor ``name`` held or needed by a rank: ``dim`` is the dim it is sliced along (None:
    the whole tensor) and ``[start, end)`` its slice of the full ``full`` entries of that dim."""

    name: str
    dim: int | None = None
    start: int = 0
    end: int = 1
    full: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end <= self.full:
            raise ValueError(f"{self.name}: slice [{self.start}, {self.end}) of {self.full} is empty or out of range")
        if self.dim is None and (self.start, self.end, self.full) != (0, 1, 1):
            raise ValueError(f"{self.name}: a whole (unsliced) tensor is [0, 1) of 1, got "
                             f"[{self.start}, {self.end}) of {self.full}")

    @staticmethod
    def whole(name: str) -> "Piece":
        return Piece(name)


@dataclass(frozen=True)
class Holding:
    """The pieces one rank holds (a source) or needs (a destination); ``rank`` is a global rank (or,
    for files, a file index)."""

    rank: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class Transfer:
    """Send ``[start, end)`` of dim ``dim`` of ``name`` (None: the whole tensor) from ``src`` to ``dst``.
    ``src_offset`` / ``dst_offset``: where the slice starts in the source's / destination's local
    tensor along ``dim``."""

    src: int
    dst: int
    name: str
    dim: int | None
    start: int
    end: int
    src_offset: int
    dst_offset: int

    @property
    def length(self) -> int:
        return self.end - self.start


def plan_transfers(sources: Sequence[Holding], destinations: Sequence[Holding]) -> list[Transfer]:
    """Every transfer of the hand-over, in the order both sides post them (see the module docstring).
    Raises ValueError, with the numbers, when a needed slice has no source or the two sides disagree
    on a tensor's slicing."""
    by_name: dict[str, list[tuple[int, Piece]]] = {}
    for h in sources:
        for p in h.pieces:
            by_name.setdefault(p.name, []).append((h.rank, p))
    out: list[Transfer] = []
    for k, dst in enumerate(destinations):
        for need in dst.pieces:
            held = by_name.get(need.name)
            if not held:
                raise ValueError(f"rank {dst.rank} needs {need.name}, which no source holds")
            for rank, p in held:
                if (p.dim, p.full) != (need.dim, need.full):
                    raise ValueError(f"{need.name}: source rank {rank} holds it sliced along dim {p.dim} of "
                                     f"{p.full}, rank {dst.rank} needs dim {need.dim} of {need.full}")
            out.extend(_cover(dst.rank, k, need, held))
    return out


def _cover(dst: int, k: int, need: Piece, held: list[tuple[int, Piece]]) -> list[Transfer]:
    """Cut ``need`` at the sources' boundaries, pick one source per cut, merge neighbours."""
    cuts = sorted({need.start, need.end} | {b for _, p in held for b in (p.start, p.end)
                                            if need.start < b < need.end})
    picked: list[tuple[int, Piece, int, int]] = []
    for lo, hi in zip(cuts, cuts[1:]):
        holders = sorted((r, p) for r, p in held if p.start <= lo and hi <= p.end)
        if not holders:
            raise ValueError(f"rank {dst} needs [{lo}, {hi}) of dim {need.dim} of {need.name}, which no source holds "
                             f"(sources hold {sorted((p.start, p.end) for _, p in held)})")
        rank, p = holders[k % len(holders)]
        if picked and picked[-1][0] == rank and picked[-1][1] == p and picked[-1][3] == lo:
            picked[-1] = (rank, p, picked[-1][2], hi)
        else:
            picked.append((rank, p, lo, hi))
    return [Transfer(rank, dst, need.name, need.dim, lo, hi, lo - p.start, lo - need.start)
            for rank, p, lo, hi in picked]


def bytes_per_rank(transfers: Sequence[Transfer], row_bytes: dict[str, int]) -> dict[int, int]:
    """Bytes each destination receives, given the bytes of one unit of each tensor's sliced dim (the
    whole tensor's bytes when unsliced)."""
    out: dict[int, int] = {}
    for t in transfers:
        out[t.dst] = out.get(t.dst, 0) + t.length * row_bytes[t.name]
    return out


__all__ = ["Holding", "Piece", "Transfer", "bytes_per_rank", "plan_transfers"]
