"""One world, two model instances: a prefill instance and a decode instance of different layouts.

Prefill/decode disaggregation runs a prompt's prefill on one group of ranks (PP_p x TP_p, a pipeline
built for long prompts) and its decoding on another (PP_d x TP_d, often PP_d = 1), inside one
``torch.distributed`` world so that the caches can move between them point to point. The world is
split in order::

    global ranks [0, PP_p * TP_p)                          the prefill instance
    global ranks [PP_p * TP_p, PP_p * TP_p + PP_d * TP_d)   the decode instance

Each instance is an ordinary grid (:mod:`.grid`: tp fastest, then pp) whose ranks are shifted by the
instance's first global rank, with its own process groups on every axis and one over the whole
instance (``ParallelGroups.instance``), so the start-up exchange, barriers and collectives of one
instance never involve the other. :func:`instance_ranks` is the pure part (no process group).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from vpp.parallel.device import accelerator_for_backend
from vpp.parallel.grid import GridSizes
from vpp.parallel.groups import ParallelGroups, build_groups

ROLES = ("prefill", "decode")


def instance_ranks(sizes: tuple[GridSizes, ...]) -> list[tuple[int, ...]]:
    """The global ranks of each instance, in order: consecutive blocks of ``world_size`` ranks."""
    out, start = [], 0
    for s in sizes:
        out.append(tuple(range(start, start + s.world_size)))
        start += s.world_size
    return out


@dataclass(frozen=True)
class Disaggregation:
    """This rank's place in a disaggregated world: its ``role`` (``"prefill"`` or ``"decode"``), its
    instance's :class:`ParallelGroups`, and both instances' sizes and global ranks."""

    role: str
    groups: ParallelGroups
    prefill: GridSizes
    decode: GridSizes
    prefill_ranks: tuple[int, ...]
    decode_ranks: tuple[int, ...]

    @property
    def is_prefill(self) -> bool:
        return self.role == "prefill"

    @property
    def world_size(self) -> int:
        return len(self.prefill_ranks) + len(self.decode_ranks)


def disaggregated_sizes(prefill_tp: int, prefill_pp: int, decode_tp: int, decode_pp: int = 1, *,
                        prefill_ep: int = 1, decode_ep: int = 1, prefill_cp: int = 1,
                        decode_cp: int = 1) -> tuple[GridSizes, GridSizes]:
    """The two instances' grids (one pipeline each: dp = 1); either instance's stages may be
    context-parallel groups of ``prefill_cp`` / ``decode_cp`` ranks (its KV caches then sharded over them)."""
    return (GridSizes(prefill_tp * prefill_cp * prefill_pp, tp=prefill_tp, pp=prefill_pp, ep=prefill_ep,
                      cp=prefill_cp),
            GridSizes(decode_tp * decode_cp * decode_pp, tp=decode_tp, pp=decode_pp, ep=decode_ep, cp=decode_cp))


def initialize_disaggregated(prefill_tp: int, prefill_pp: int, decode_tp: int, decode_pp: int = 1, *,
                             prefill_ep: int = 1, decode_ep: int = 1, prefill_cp: int = 1,
                             decode_cp: int = 1) -> Disaggregation:
    """Split the initialised world into a prefill and a decode instance (a collective: every rank
    calls it). The world must hold exactly ``prefill_tp * prefill_cp * prefill_pp + decode_tp *
    decode_cp * decode_pp`` ranks."""
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised; call vpp.parallel.init_distributed() first")
    sizes = disaggregated_sizes(prefill_tp, prefill_pp, decode_tp, decode_pp,
                                prefill_ep=prefill_ep, decode_ep=decode_ep, prefill_cp=prefill_cp, decode_cp=decode_cp)
    world, rank = dist.get_world_size(), dist.get_rank()
    need = sum(s.world_size for s in sizes)
    if world != need:
        raise ValueError(f"prefill tp={prefill_tp} x cp={prefill_cp} x pp={prefill_pp} plus decode tp={decode_tp} x "
                         f"cp={decode_cp} x pp={decode_pp} needs {need} ranks, but the world has {world}")
    acc = accelerator_for_backend(str(dist.get_backend()).lower())
    local = acc.module().current_device() if acc.kind != "cpu" else 0
    ranks = instance_ranks(sizes)
    mine = None
    for role, s, members in zip(ROLES, sizes, ranks):
        built = build_groups(s, rank, acc, acc.device(local), first_rank=members[0], instance=True)
        if built is not None:
            mine = (role, built)
    role, groups = mine
    return Disaggregation(role, groups, sizes[0], sizes[1], ranks[0], ranks[1])


__all__ = ["Disaggregation", "ROLES", "disaggregated_sizes", "initialize_disaggregated", "instance_ranks"]
