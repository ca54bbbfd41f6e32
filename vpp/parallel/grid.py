"""The rank grid: which global ranks form each parallel group. Pure functions, no process group.

Global ranks are laid out with ``tp`` varying fastest, then ``cp`` (context parallelism), then
``dp``, then ``pp`` (Megatron's tp-cp-ep-dp-pp order)::

    global_rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

so the ranks of one tensor-parallel group are contiguous (one node's devices), a context-parallel
group's ranks are the closest after them (its ring or all-gather carries a chunk's K/V every layer),
and the pipeline crosses nodes. A CP group holds the ranks of equal tp/dp/pp coordinates: each of
them is a whole TP group that processes its share of every chunk's tokens. Expert parallelism lives inside a stage's tensor-parallel group, as in the paper's
deployment (TP8 with the experts spread over the same 8 devices): ``ep`` must divide ``tp``; the
``ep`` ranks of an expert-parallel group are contiguous inside their TP group, and the remaining
factor ``etp = tp // ep`` shards each expert's weights (expert tensor parallelism)::

    tp_rank = ep_rank + ep * etp_rank
"""

from __future__ import annotations

from dataclasses import dataclass

AXES = ("tp", "pp", "dp", "ep", "etp", "cp")


@dataclass(frozen=True)
class GridSizes:
    world_size: int
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        for name in ("world_size", "tp", "pp", "ep", "dp", "cp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        product = self.tp * self.cp * self.pp * self.dp
        if product != self.world_size:
            raise ValueError(f"tp={self.tp} * cp={self.cp} * pp={self.pp} * dp={self.dp} = {product} "
                             f"!= world_size={self.world_size}")
        if self.tp % self.ep:
            raise ValueError(f"ep={self.ep} must divide tp={self.tp} (experts live inside a TP group)")

    @property
    def etp(self) -> int:
        return self.tp // self.ep


@dataclass(frozen=True)
class Coordinates:
    """Where one global rank sits on each axis."""

    tp: int
    pp: int
    dp: int
    ep: int
    etp: int
    cp: int = 0


def coordinates(sizes: GridSizes, global_rank: int) -> Coordinates:
    if not 0 <= global_rank < sizes.world_size:
        raise ValueError(f"global rank {global_rank} outside world_size={sizes.world_size}")
    tp_rank = global_rank % sizes.tp
    cp_rank = (global_rank // sizes.tp) % sizes.cp
    dp_rank = (global_rank // (sizes.tp * sizes.cp)) % sizes.dp
    pp_rank = global_rank // (sizes.tp * sizes.cp * sizes.dp)
    return Coordinates(tp=tp_rank, pp=pp_rank, dp=dp_rank, ep=tp_rank % sizes.ep, etp=tp_rank // sizes.ep,
                       cp=cp_rank)


def global_rank(sizes: GridSizes, *, tp: int = 0, pp: int = 0, dp: int = 0, cp: int = 0) -> int:
    return tp + sizes.tp * (cp + sizes.cp * (dp + sizes.dp * pp))


def rank_groups(sizes: GridSizes) -> dict[str, list[tuple[int, ...]]]:
    """Every group on every axis, as sorted tuples of global ranks, in a fixed order.

    Each global rank appears in exactly one group per axis; a group lists its members in order of
    their rank along that axis (so ``groups["pp"][i][j]`` is pipeline rank ``j`` of pipeline ``i``).
    """
    out: dict[str, list[tuple[int, ...]]] = {axis: [] for axis in AXES}
    for pp in range(sizes.pp):
        for dp in range(sizes.dp):
            for cp in range(sizes.cp):
                base = global_rank(sizes, pp=pp, dp=dp, cp=cp)
                out["tp"].append(tuple(base + t for t in range(sizes.tp)))
                for e in range(sizes.etp):
                    out["ep"].append(tuple(base + e * sizes.ep + i for i in range(sizes.ep)))
                for i in range(sizes.ep):
                    out["etp"].append(tuple(base + e * sizes.ep + i for e in range(sizes.etp)))
    for dp in range(sizes.dp):
        for cp in range(sizes.cp):
            for tp in range(sizes.tp):
                out["pp"].append(tuple(global_rank(sizes, tp=tp, pp=pp, dp=dp, cp=cp) for pp in range(sizes.pp)))
    for pp in range(sizes.pp):
        for cp in range(sizes.cp):
            for tp in range(sizes.tp):
                out["dp"].append(tuple(global_rank(sizes, tp=tp, pp=pp, dp=dp, cp=cp) for dp in range(sizes.dp)))
    for pp in range(sizes.pp):
        for dp in range(sizes.dp):
            for tp in range(sizes.tp):
                out["cp"].append(tuple(global_rank(sizes, tp=tp, pp=pp, dp=dp, cp=cp) for cp in range(sizes.cp)))
    return out


def group_of(groups: dict[str, list[tuple[int, ...]]], axis: str, global_rank_: int) -> tuple[int, ...]:
    """The one group on ``axis`` that holds ``global_rank_``."""
    for members in groups[axis]:
        if global_rank_ in members:
            return members
    raise ValueError(f"global rank {global_rank_} is in no {axis} group")


__all__ = ["AXES", "Coordinates", "GridSizes", "coordinates", "global_rank", "group_of", "rank_groups"]
