"""What the executor asks of a backend whose device orders the work (NCCL, HCCL): enqueue, never wait.

On gloo a transfer runs in host threads, so the host must wait for it before the data can be used
(:mod:`.watchdog`). On NCCL and HCCL every operation is queued on a device stream and the streams order
it; :class:`StreamOps` is the handful of primitives the executor uses there:

* ``isend`` / ``irecv`` post on the pair communicator's own stream. ProcessGroupNCCL first makes that
  stream wait for the work already queued on the *current* stream (``syncStream``), so a receive posted
  before a compute is enqueued is not held back by that compute: the plan lists every receive ahead of
  the compute that precedes its consumer, and the executor posts in plan order.
* ``order_after(work)`` is ``Work.wait()``: on NCCL/HCCL it makes the current stream wait for the
  transfer's end event and returns at once; the host does not wait.
* ``mark()`` records an event on the current stream; ``is_done(handle)`` queries an event or a Work
  without blocking (``Work.is_completed()`` is a query of the work's end event on NCCL/HCCL).
* ``host_wait(event, check)`` is the only place the host waits for the device: the run-ahead bound and
  the end of a run (never a transfer in the steady state). It polls the event every <= 1 ms, calling
  ``check()`` (the watchdog thread's verdict) in between, so a fault stops the rank even there.
* ``warm(pairs)`` makes the first (set-up) exchange of each pair communicator, see
  :func:`warm_pair_communicators`.

Counters: ``host_transfer_waits`` (host waits on a transfer: a communicator's set-up, or the end of a
run's sends), ``host_compute_waits`` (run-ahead bound), ``end_waits``. An emulated device
(:mod:`vpp.testing.emulated_run`) implements the same primitives in virtual time.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

import torch
import torch.distributed as dist

from vpp.parallel.comm import batch_p2p, first_call, irecv, isend
from vpp.parallel.groups import Group, ParallelGroups

from .teardown import abort_groups
from .watchdog import rendezvous

STREAM_ORDERED_BACKENDS = ("nccl", "hccl")
log = logging.getLogger(__name__)

# What one stream per process group costs, from the emulated device (``python -m
# benchmarks.device_emulation``, VPP-Async, PP 4, 16 chunks, transfer = first chunk's compute), each
# against one stream per pair: said once when a run meets that setup (see :func:`one_stream_per_group`).
ONE_STREAM_COST = ("emulated VPP-Async at PP 4: makespan +0.9% with a step's transfers posted one by one, "
                   "+0.0% batched")

# How many computes the host may have queued beyond the oldest one the device has not finished. Two:
# one running and one queued keep the device busy whatever the host's jitter; each compute ahead holds
# its input, output and the receive buffers posted before it, so more only grows memory.
RUN_AHEAD_COMPUTES = 2


def orders_on_device(groups: ParallelGroups) -> bool:
    """True when the pipeline's process group is NCCL or HCCL (asked of the group, not the machine)."""
    pg = groups.pp.pg
    if pg is None or not dist.is_initialized():
        return False
    return str(dist.get_backend(pg)).lower() in STREAM_ORDERED_BACKENDS


class StreamOps:
    """The device primitives on CUDA / NPU with NCCL / HCCL (see the module docstring)."""

    def __init__(self, module, *, max_pause_s: float = 1e-3, device: torch.device | None = None,
                 groups: ParallelGroups | None = None):
        self.module = module  # torch.cuda or torch.npu
        self.max_pause_s = max_pause_s
        self.device, self.groups = device, groups
        self.host_transfer_waits = self.host_compute_waits = self.end_waits = 0

    def isend(self, x: torch.Tensor, peer: int, group: Group):
        return isend(x, peer, group)

    def irecv(self, buf: torch.Tensor, peer: int, group: Group):
        return irecv(buf, peer, group)

    fuses = False  # post a step's transfers as one batch (a group with one stream, see stream_ops_for)

    def batch(self, items, group: Group) -> list:
        """``items`` ((kind, tensor, peer)) as one ``batch_isend_irecv`` on ``group``: one work each."""
        return batch_p2p(items, group)

    def order_after(self, work) -> None:
        work.wait()  # NCCL/HCCL: the current stream waits for the work's end event; the host does not

    def mark(self):
        event = self.module.Event()
        event.record()
        return event

    def is_done(self, handle) -> bool:
        return bool(handle.query() if hasattr(handle, "query") else handle.is_completed())

    def host_wait(self, event, check: Callable[[], None], *, end: bool = False) -> None:
        if end:
            self.end_waits += 1
        else:
            self.host_compute_waits += 1
        pause = 1e-5
        while not event.query():
            check()
            time.sleep(pause)
            pause = min(pause * 2, self.max_pause_s)

    def select_device(self) -> None:
        """Make the rank's device current on the calling thread (the watchdog thread's first act)."""
        if self.device is not None:
            self.module.set_device(self.device)

    def abort(self) -> None:
        """After a fault: abort every communicator of the rank's groups (see :func:`.watchdog.abort_groups`)."""
        if self.groups is not None:
            g = self.groups
            abort_groups([x.pg for x in (g.pp, g.pp_up, g.tp, g.dp, g.ep, g.etp) if x is not None])

    def warm(self, groups: ParallelGroups, peers: Iterable[int]) -> None:
        warm_pair_communicators(groups, peers, self)


def one_stream_per_group(pg) -> str | None:
    """Why ``pg`` runs all its point-to-point transfers on one communicator and stream (None when it
    keeps one per pair, NCCL's lazy default): HCCL always; NCCL when the default group was initialised
    eagerly (``init_process_group(device_id=...)``: its groups' p2p use the group's communicator)."""
    if pg is None or not dist.is_initialized():
        return None
    backend = str(dist.get_backend(pg)).lower()
    if backend == "hccl":
        return "HCCL runs a process group's point-to-point transfers on its one stream"
    if backend == "nccl":
        try:
            bound = dist.distributed_c10d._get_default_group().bound_device_id
        except Exception:  # private API: assume the lazy default
            bound = None
        if bound is not None:
            return (f"NCCL was initialised eagerly (device_id={bound}): a process group's point-to-point "
                    f"transfers share its one communicator and stream")
    return None


_SAID: set[str] = set()


def stream_ops_for(groups: ParallelGroups) -> StreamOps | None:
    """:class:`StreamOps` for a pipeline on NCCL/HCCL, None for gloo (the host-waiting path). Where a
    group has one stream (:func:`one_stream_per_group`) the ops fuse each step's transfers into one
    batch (``fuses``), and the process says so once, in one line, with the cost."""
    if not orders_on_device(groups):
        return None
    ops = StreamOps(groups.accelerator.module(), device=groups.device, groups=groups)
    why = one_stream_per_group(groups.pp.pg)
    if why is not None:
        ops.fuses = True
        if why not in _SAID:
            _SAID.add(why)
            log.warning("vpp: %s, so the V's two directions and the collectives serialise (%s); each step's "
                        "sends and receives go as one batch_isend_irecv", why, ONE_STREAM_COST)
    return ops


def neighbours(layout, rank: int) -> set[int]:
    """The pipeline ranks that ``rank`` exchanges activations with under ``layout`` (holders of the
    stages next to its own): the pair communicators a plan on it can use."""
    return {layout.rank_of(s + d) for s in layout.stages_of(rank) for d in (-1, 1)
            if 0 <= s + d < layout.num_stages} - {rank}


def warm_pair_communicators(groups: ParallelGroups, peers: Iterable[int], ops) -> None:
    """Make the first exchange of every pair communicator this rank's plans use, so that NCCL/HCCL's
    lazy communicator set-up (a host-blocking rendezvous with the peer) happens here and not inside a
    prefill's TTFT. ``peers``: the pipeline ranks this rank exchanges with; the channel of each direction
    of each pair carries one element (every rank walks its peers in increasing order and each pair's
    two directions lower rank first, so the pairs meet without a cycle)."""
    me = groups.pp.rank
    one = torch.zeros(1, device=groups.device)
    for peer in sorted(set(peers) - {me}):
        lo, hi = min(me, peer), max(me, peer)
        for src, dst in ((lo, hi), (hi, lo)):  # the same order on both ranks of the pair
            group = groups.pp_channel(src, dst)
            work = ops.isend(one, dst, group) if src == me else ops.irecv(torch.empty(1, device=groups.device), src, group)
            ops.order_after(work)


def warm_communicators(groups: ParallelGroups, peers: Iterable[int], ops, *, timeout_s: float) -> list[str]:
    """Set up every communicator this rank's calls use before the first timed one (NCCL/HCCL create
    them lazily, in the first call, blocking the host): a one-element all-reduce on each of its TP, EP,
    expert-TP, DP and pipeline groups (the pipeline group's collective carries the logits broadcast),
    then the pair communicators (:func:`warm_pair_communicators`). Each set-up is preceded by a bounded
    meeting of the group's members in the store (:func:`.watchdog.rendezvous`): a member that never
    comes raises, naming it, within ``timeout_s``, instead of leaving this rank inside a set-up that
    nothing can interrupt. Every rank warms its groups in the same axis order, so the set-ups of
    different groups never wait for each other in a cycle. Returns the groups warmed, by axis."""
    warmed, seen = [], set()
    for axis in ("tp", "ep", "etp", "dp", "pp", "pp_up"):
        group = getattr(groups, axis)
        if group is None or group.pg is None or id(group.pg) in seen:
            continue
        seen.add(id(group.pg))
        rendezvous(f"the {axis} communicator's set-up", groups.global_rank, group.ranks, timeout_s=timeout_s)
        first_call(group, groups.device)
        warmed.append(axis)
    peers = sorted(set(peers) - {groups.pp.rank})
    if peers:
        rendezvous("the pipeline pairs' set-up", groups.global_rank, groups.pp.ranks, timeout_s=timeout_s)
        warm_pair_communicators(groups, peers, ops)
        warmed.append("pairs")
    return warmed


__all__ = [
    "ONE_STREAM_COST", "RUN_AHEAD_COMPUTES", "STREAM_ORDERED_BACKENDS", "StreamOps", "neighbours",
    "one_stream_per_group", "orders_on_device",
    "stream_ops_for", "warm_communicators", "warm_pair_communicators",
]
