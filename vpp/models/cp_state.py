"""What a stage remembers per request under context parallelism: how many tokens it has processed,
and the global positions of every CP rank's cached rows (the ranks' shares are known to all of them,
so no one asks). It chooses each chunk's attention method and records it (``Stage.cp_trace``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from vpp.parallel.groups import Group
from vpp.transformer.attention.context_parallel import METHODS, CPChunk, CPStep, Split, choose_method

CP_METHODS = ("auto", *METHODS)


@dataclass
class CPState:
    ranks: int
    tokens: int = 0
    positions: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.positions = self.positions or [torch.zeros(0, dtype=torch.long) for _ in range(self.ranks)]

    def add_chunk(self, group: Group, offset: int, tokens: int, method: str, kv_per_q: float) -> CPChunk:
        """Record a chunk of ``tokens`` at ``offset`` split over the group; its :class:`CPChunk`."""
        if method not in CP_METHODS:
            raise ValueError(f"unknown CP attention method {method!r}; choose from {', '.join(CP_METHODS)}")
        split = Split(tokens, group.size)
        if method == "auto":
            method = choose_method(tokens, offset, kv_per_q)
        prefix = tuple(len(p) for p in self.positions)
        self.positions = [torch.cat((p, offset + split.index(t))) for t, p in enumerate(self.positions)]
        self.tokens += tokens
        return CPChunk(group, split, offset, prefix, tuple(self.positions), method)

    def add_token(self, group: Group) -> CPStep:
        """A decoded token: kept by the rank with the fewest rows (the lowest such rank)."""
        owner = min(range(self.ranks), key=lambda t: (len(self.positions[t]), t))
        self.positions[owner] = torch.cat((self.positions[owner], torch.tensor([self.tokens])))
        self.tokens += 1
        return CPStep(group, owner, tuple(self.positions))


def gather_rows(local: torch.Tensor, split: Split, group: Group) -> torch.Tensor:
    """Every rank's rows of a chunk ([count(t), ...] each) back in chunk order [tokens, ...] (the
    transfer padded to the longest share)."""
    longest = max(split.count(t) for t in range(group.size))
    pad = local.new_zeros((longest - local.shape[0], *local.shape[1:]))
    buf = torch.cat((local, pad)).contiguous()
    parts = [torch.empty_like(buf) for _ in range(group.size)]
    dist.all_gather(parts, buf, group=group.pg)
    out = local.new_empty((split.tokens, *local.shape[1:]))
    for t, part in enumerate(parts):
        index = split.index(t)
        out[index.to(out.device)] = part[:len(index)]
    return out


def from_owner(row: torch.Tensor | None, owner: int, shape, like: torch.Tensor, group: Group) -> torch.Tensor:
    """``row`` (given on rank ``owner``) on every rank of the group."""
    buf = row.contiguous() if group.rank == owner else like.new_empty(shape)
    dist.broadcast(buf, src=group.global_rank(owner), group=group.pg)
    return buf


__all__ = ["CP_METHODS", "CPState", "from_owner", "gather_rows"]
