"""Parallel groups as an object that is passed in.

:class:`ParallelGroups` is frozen and holds one :class:`Group` per mesh axis. Library code takes it
as an argument; :func:`initialize_model_parallel` builds it (and records it as the default that the
Megatron-style accessors at the bottom read, a thin convenience for scripts).
"""

from __future__ import annotations

import datetime
import numbers
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from vpp.parallel.device import Accelerator, accelerator_for_backend, get_accelerator
from vpp.parallel.grid import AXES, GridSizes, coordinates, group_of, rank_groups


@dataclass(frozen=True)
class Group:
    """A process group and what a caller needs to know about it without asking torch.

    ``ranks`` are the members' global ranks in axis order; ``rank`` is this process's index in it.
    ``pg`` is ``None`` only for a group of one, where every collective is a no-op.
    """

    ranks: tuple[int, ...]
    rank: int
    pg: dist.ProcessGroup | None = field(default=None, compare=False, repr=False)

    @property
    def size(self) -> int:
        return len(self.ranks)

    def global_rank(self, index: int) -> int:
        """Global rank of the member at ``index`` along this axis (for point-to-point calls)."""
        return self.ranks[index]

    @staticmethod
    def single(global_rank: int = 0) -> "Group":
        return Group(ranks=(global_rank,), rank=0, pg=None)


@dataclass(frozen=True)
class ParallelGroups:
    """This process's place in the (tp, pp, dp, ep) grid, with a :class:`Group` per axis."""

    sizes: GridSizes
    global_rank: int
    tp: Group
    pp: Group
    dp: Group
    ep: Group
    etp: Group
    accelerator: Accelerator
    device: torch.device
    # A second process group over the same pipeline ranks, used for transfers towards lower ranks:
    # the two directions of a V never queue behind each other on one communicator (the paper's two
    # alternating communication groups; on NCCL/HCCL each group has its own stream).
    pp_up: Group | None = None
    # The ranks of this model instance (every axis above lives inside it), with a process group over
    # them: the start-up exchange and barriers run on it. None: torch.distributed's whole world. A
    # world split into a prefill and a decode instance (:mod:`vpp.parallel.instances`) sets it.
    instance: Group | None = None
    # The context-parallel group: the ranks (equal tp/dp/pp coordinates) that split each chunk's
    # tokens (vpp.transformer.attention.context_parallel). None: a group of this rank alone.
    cp: Group | None = None

    def __post_init__(self) -> None:
        if self.cp is None:
            object.__setattr__(self, "cp", Group.single(self.global_rank))

    @property
    def members(self) -> tuple[int, ...]:
        """Global ranks of this instance (``range(world_size)`` when it is the whole world)."""
        return self.instance.ranks if self.instance is not None else tuple(range(self.sizes.world_size))

    @property
    def instance_pg(self) -> dist.ProcessGroup | None:
        """The process group of this instance for collectives (None: the default group, the world)."""
        return self.instance.pg if self.instance is not None else None

    def pp_channel(self, src: int, dst: int) -> Group:
        """The group that carries a pipeline transfer from pipeline rank ``src`` to ``dst``."""
        if self.pp_up is not None and dst < src:
            return self.pp_up
        return self.pp

    @staticmethod
    def virtual(sizes: GridSizes, global_rank: int = 0, *, device: torch.device | str = "meta") -> "ParallelGroups":
        """``global_rank``'s place in the grid with no process groups behind it (``pg`` is None even
        for groups of several): for building modules on the meta device to check, before any rank
        starts, that a model splits over these sizes. Never run collectives on it."""
        mine = {}
        for axis, members_list in rank_groups(sizes).items():
            for members in members_list:
                if global_rank in members:
                    mine[axis] = Group(members, members.index(global_rank), None)
        acc = get_accelerator("cpu")
        return ParallelGroups(sizes, global_rank, accelerator=acc, device=torch.device(device), pp_up=mine["pp"], **mine)

    @staticmethod
    def single(accelerator: Accelerator | None = None, device: torch.device | None = None) -> "ParallelGroups":
        """One process, no parallelism: every group has one member and no process group."""
        acc = accelerator or get_accelerator("cpu")
        one = Group.single(0)
        return ParallelGroups(GridSizes(1), 0, one, one, one, one, one, acc, device or acc.device(0), one)


def build_groups(
    sizes: GridSizes,
    global_rank: int,
    accelerator: Accelerator,
    device: torch.device,
    *,
    first_rank: int = 0,
    instance: bool = False,
    timeout_s: float | None = None,
) -> ParallelGroups | None:
    """Create the process groups of every axis (a collective call: every rank of the world must call
    it). The grid's ranks are global ranks ``first_rank ..  first_rank + sizes.world_size - 1``;
    ``instance``: also a process group over all of them (``ParallelGroups.instance``), for a grid that
    is one part of a larger world. ``timeout_s``: every group's timeout (default: the default process
    group's, i.e. the run's ``timeout_s`` given to :func:`~vpp.parallel.rendezvous.init_distributed`;
    torch would otherwise give each subgroup its backend's default, 10 minutes on NCCL). Returns None on
    a rank outside the grid."""
    timeout = group_timeout(timeout_s)
    shift = lambda members: tuple(first_rank + r for r in members)  # noqa: E731
    all_groups = {axis: [shift(m) for m in members] for axis, members in rank_groups(sizes).items()}
    mine: dict[str, Group] = {}
    for axis in AXES:
        for members in all_groups[axis]:
            # new_group must be called by every process for every group, in the same order.
            pg = dist.new_group(list(members), timeout=timeout) if len(members) > 1 else None
            if global_rank in members:
                mine[axis] = Group(members, members.index(global_rank), pg)
    for members in all_groups["pp"]:
        pg = dist.new_group(list(members), timeout=timeout) if len(members) > 1 else None
        if global_rank in members:
            mine["pp_up"] = Group(members, members.index(global_rank), pg)
    if instance:
        members = shift(range(sizes.world_size))
        pg = dist.new_group(list(members), timeout=timeout) if len(members) > 1 else None
        if global_rank in members:
            mine["instance"] = Group(members, members.index(global_rank), pg)
    if "tp" not in mine:
        return None
    return ParallelGroups(sizes, global_rank, accelerator=accelerator, device=device, **mine)


def group_timeout(timeout_s: float | None = None) -> datetime.timedelta | None:
    """The timeout for a new subgroup: ``timeout_s``, else the default process group's (None when torch
    does not say: its backend default applies)."""
    if timeout_s is not None:
        return datetime.timedelta(seconds=float(timeout_s))
    try:
        pg = dist.distributed_c10d._get_default_group()
        device = torch.device("cpu") if "gloo" in str(dist.get_backend(pg)).lower() else pg.bound_device_id
        return pg._get_backend(device or torch.device("cuda")).options._timeout  # private: default on failure
    except Exception:
        return None


def initialize_model_parallel(
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    expert_model_parallel_size: int = 1,
    *,
    context_parallel_size: int = 1,
    accelerator: Accelerator | None = None,
    local_rank: int | None = None,
    timeout_s: float | None = None,
) -> ParallelGroups:
    """Megatron-style entry point. ``torch.distributed`` must already be initialised (see
    :func:`vpp.parallel.rendezvous.init_distributed`). Any world size that is a multiple of
    tp x cp x pp gives ``dp = world // (tp * cp * pp)`` data-parallel replicas of the pipeline;
    ``context_parallel_size`` ranks (each a TP group) split every chunk's tokens.

    The device follows the default process group's backend (gloo: CPU, NCCL: CUDA, HCCL: NPU), so
    stages are never placed on a device the process group cannot move; an ``accelerator`` that
    disagrees with the backend is an error. The card is ``local_rank``'s, else the current device
    (set by :func:`~vpp.parallel.rendezvous.init_distributed`). ``timeout_s``: the groups' timeout
    (default: the default process group's, see :func:`build_groups`)."""
    tp, pp, cp = tensor_model_parallel_size, pipeline_model_parallel_size, context_parallel_size
    for name, value in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp),
                        ("expert_model_parallel_size", expert_model_parallel_size),
                        ("context_parallel_size", cp)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised; call vpp.parallel.init_distributed() first")
    world, rank = dist.get_world_size(), dist.get_rank()
    tp, pp, cp = int(tp), int(pp), int(cp)
    if world % (tp * cp * pp):
        factors = f"tp={tp} * cp={cp} * pp={pp}" if cp > 1 else f"tp={tp} * pp={pp}"
        raise ValueError(f"{factors} = {tp * cp * pp} does not divide world_size={world}")
    sizes = GridSizes(world, tp=tp, pp=pp, ep=int(expert_model_parallel_size), dp=world // (tp * cp * pp), cp=cp)
    backend = str(dist.get_backend()).lower()
    acc = accelerator or accelerator_for_backend(backend)
    if acc.backend != backend:
        raise ValueError(f"the process group runs {backend!r}, but device {acc.kind!r} needs {acc.backend!r}: "
                         f"initialise torch.distributed with the device's backend")
    if local_rank is None and acc.kind != "cpu":
        local_rank = acc.module().current_device()
    device = acc.device(local_rank or 0)
    groups = build_groups(sizes, rank, acc, device, timeout_s=timeout_s)
    return groups


__all__ = ["Group", "ParallelGroups", "build_groups", "group_timeout", "initialize_model_parallel", "coordinates", "group_of"]
