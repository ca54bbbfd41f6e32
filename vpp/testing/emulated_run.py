"""The real executor on the emulated device (:mod:`.emulated_device`): each pipeline rank is a thread
running :class:`~vpp.runtime.executor.Executor` with :class:`EmulatedOps` as its device primitives and
:class:`EmulatedStage` modules as its stages; :func:`emulate` runs a plan and returns the timeline's
measures and each rank's counters.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from vpp.parallel.device import get_accelerator
from vpp.parallel.grid import GridSizes
from vpp.parallel.groups import Group, ParallelGroups
from vpp.schedules.ir import RECV, SEND, Plan

from vpp.runtime.device_order import warm_pair_communicators
from .emulated_device import EmulatedDevice, EmulationError, RankCounters, _Event, _Work
from vpp.runtime.executor import Executor
from vpp.runtime.handshake import RankInfo, StageInfo


class EmulatedOps:
    """:class:`~vpp.runtime.device_order.StreamOps`'s primitives for pipeline rank ``rank`` of an emulated device."""

    def __init__(self, device: EmulatedDevice, rank: int, groups: ParallelGroups):
        self.device, self.rank, self.groups = device, rank, groups
        self.store = device.store  # the ranks' shared key-value store (failure notices)

    def select_device(self, *, host: bool = False) -> None:
        self.device.select_device(self.rank, host=host)

    def abort(self) -> None:
        self.device.abort(self.rank)

    def _channel(self, group: Group) -> str:
        return "up" if group is self.groups.pp_up and group is not self.groups.pp else "down"

    def isend(self, x: torch.Tensor, peer: int, group: Group) -> _Work:
        return self.device.post(self.rank, "send", x, peer, self._channel(group), f"send {self.rank}>{peer}")

    def irecv(self, buf: torch.Tensor, peer: int, group: Group) -> _Work:
        return self.device.post(self.rank, "recv", buf, peer, self._channel(group), f"recv {self.rank}<{peer}")

    def order_after(self, work: _Work) -> None:
        work.wait()

    @property
    def fuses(self) -> bool:
        """Batch a step's transfers where a group has one stream (as :func:`~vpp.runtime.device_order.stream_ops_for`)."""
        return self.device.streams != "pair" if self.fuse is None else self.fuse

    fuse: bool | None = None  # None: follow the stream model; True/False: force (the benchmark's comparison)

    def batch(self, items, group: Group) -> list[_Work]:
        channel = self._channel(group)
        return self.device.post_batch(self.rank, [(kind, t, peer, channel, f"{kind} {self.rank}{'>' if kind == 'send' else '<'}{peer}")
                                                  for kind, t, peer in items])

    def mark(self) -> _Event:
        return _Event(self.device, self.device.marker(self.rank, "event"))

    def is_done(self, handle) -> bool:
        return handle.query() if isinstance(handle, _Event) else handle.is_completed()

    def host_wait(self, event: _Event, check, *, end: bool = False) -> None:
        self.device.host_wait(self.rank, event.op, check, "end_waits" if end else "host_compute_waits")


class HostWaitingOps(EmulatedOps):
    """A device path that copies gloo's host-side waiting (what issue 19 found): the host waits for
    every transfer before ordering work after it. Exists to show that the counters catch it."""

    def order_after(self, work: _Work) -> None:
        self.device.host_wait(self.rank, work.op, lambda: None, "host_transfer_waits")
        work.wait()


class EmulatedStage(torch.nn.Module):
    """A stage that follows the stage contract and computes nothing: each call enqueues one compute of
    ``cost.compute(stage, tokens, prefix)`` on its rank's emulated compute stream."""

    def __init__(self, device: EmulatedDevice, rank: int, stage: int, layer_range: tuple[int, int], *,
                 hidden: int, vocab: int, is_first: bool, is_last: bool):
        super().__init__()
        self.device, self.rank, self.stage = device, rank, stage
        self.layer_range, self.hidden_size, self.vocab_size = layer_range, hidden, vocab
        self.is_first, self.is_last, self.dtype = is_first, is_last, torch.float32

    def forward(self, x: torch.Tensor, request: int, offset: int, last_token_only: bool = False) -> torch.Tensor:
        tokens = int(x.shape[0])
        duration = float(self.device.cost.compute(self.stage, tokens, offset))
        self.device.compute(self.rank, f"F{self.stage}.r{request}@{offset}", duration, inputs=(x,), stage=self.stage)
        return torch.zeros(1 if last_token_only else tokens, self.vocab_size if self.is_last else self.hidden_size)


@dataclass
class EmulationResult:
    makespan_s: float
    recv_overlap: float  # steady state (EmulatedDevice.recv_overlap)
    recv_overlap_all: float  # every receive, fill and drain included
    counters: list[RankCounters]
    num_chunks: int
    logits: dict = field(default_factory=dict)

    def per_chunk(self, name: str) -> float:
        return sum(getattr(c, name) for c in self.counters) / self.num_chunks


def _groups(n: int, r: int) -> ParallelGroups:
    one = Group.single(r)
    pp, up = Group(tuple(range(n)), r), Group(tuple(range(n)), r)
    return ParallelGroups(GridSizes(world_size=n, pp=n), r, one, pp, one, one, one, get_accelerator("cpu"),
                          torch.device("cpu"), pp_up=up)


def _peers(plan: Plan, rank: int) -> set[int]:
    return {a.peer for a in plan.actions[rank] if a.op in (SEND, RECV)}


class EmulatedRun:
    """``plan`` ready to run with the real executor on an emulated device (one thread per pipeline
    rank): ``stages[rank][stage]`` are the :class:`EmulatedStage` modules (replaceable before
    :meth:`run`). ``warm``: set up every pair communicator before the run (as
    :class:`~vpp.runtime.pipeline.Pipeline` does); ``host_waits``: use :class:`HostWaitingOps` (the path issue 19
    replaced); ``timeout_s``: the executor's (its watchdog's) timeout; ``streams``: the device's stream
    model (:class:`~.emulated_device.EmulatedDevice`); ``fuse``: batch each step's transfers (default:
    where the stream model has one stream per group or rank, as the real ops decide)."""

    def __init__(self, plan: Plan, cost, *, hidden: int = 16, vocab: int = 8, warm: bool = True,
                 host_waits: bool = False, timeout_s: float = 60.0, streams: str = "pair", fuse: bool | None = None):
        n, layout = plan.num_ranks, plan.layout
        self.plan, self.warm, self.timeout_s = plan, warm, timeout_s
        self.device = EmulatedDevice(n, cost, timeout_s=3 * timeout_s + 5, pg_timeout_s=timeout_s, streams=streams)
        self.groups = [_groups(n, r) for r in range(n)]
        self.stages, self.infos = [], []
        for r in range(n):
            mine = {s: EmulatedStage(self.device, r, s, layout.stage_layers[s], hidden=hidden, vocab=vocab,
                                     is_first=s == 0, is_last=s == layout.last_stage) for s in layout.stages_of(r)}
            self.stages.append(mine)
            self.infos.append(RankInfo(r, r, 0, tuple(StageInfo(st.layer_range, hidden, vocab, st.is_first,
                                                                st.is_last, str(st.dtype), None)
                                                      for st in mine.values()), None, None, None, "emulated"))
        kind = HostWaitingOps if host_waits else EmulatedOps
        self.ops = [kind(self.device, r, self.groups[r]) for r in range(n)]
        for o in self.ops:
            o.fuse = fuse

    def run(self) -> EmulationResult:
        plan, n, device = self.plan, self.plan.num_ranks, self.device
        prompts = {q.id: torch.zeros(q.length, dtype=torch.long) for q in plan.requests}
        barrier = threading.Barrier(n, timeout=self.device.timeout_s)
        results: list = [None] * n
        errors: dict[int, BaseException] = {}

        def rank_main(r: int) -> None:
            started = False
            try:
                self.ops[r].select_device(host=True)  # as init_distributed does on the rank's thread
                if self.warm:
                    warm_pair_communicators(self.groups[r], _peers(plan, r), self.ops[r])
                if barrier.wait() == 0:
                    device.start_epoch()
                barrier.wait()
                started = True
                ex = Executor(plan, self.stages[r], self.groups[r], self.infos, run_key=f"emulated-{id(self)}",
                              timeout_s=self.timeout_s, poll_s=0.02, timed=False, device_ops=self.ops[r])
                results[r] = ex.run(prompts if 0 in self.stages[r] else None)
            except BaseException as exc:  # reported below, on the caller's thread
                errors[r] = exc
                if not started:  # release the ranks waiting for this one at the start; once every rank
                    barrier.abort()  # passed it, an abort would break a slow one still waking from it

        threads = [threading.Thread(target=rank_main, args=(r,), name=f"emulated-rank-{r}", daemon=True)
                   for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(device.timeout_s + 5)
        if any(t.is_alive() for t in threads):
            raise EmulationError(f"emulated ranks still running after {device.timeout_s:g}s")
        if errors:
            first = min(errors, key=lambda r: (isinstance(errors[r], threading.BrokenBarrierError), r))
            err = EmulationError("; ".join(f"emulated rank {r} failed: {type(e).__name__}: {e}"
                                           for r, e in sorted(errors.items())))
            err.errors = errors
            raise err from errors[first]
        logits = {q: v for res in results for q, v in res.logits.items()}
        chunks = sum(q.num_chunks for q in plan.requests)
        return EmulationResult(device.makespan(), device.recv_overlap(), device.recv_overlap(steady=False),
                               device.counters, chunks, logits)


def emulate(plan: Plan, cost, **kw) -> EmulationResult:
    """Run ``plan`` with the real executor on an emulated device (see :class:`EmulatedRun`)."""
    return EmulatedRun(plan, cost, **kw).run()


__all__ = ["EmulatedOps", "EmulatedRun", "EmulatedStage", "EmulationResult", "HostWaitingOps", "emulate"]
