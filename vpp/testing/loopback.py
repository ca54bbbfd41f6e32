"""The executor's device path on ONE device: two pipeline ranks as two threads of one process, each
with its own CUDA stream as its current stream, and transfers that are device-to-device copies on a
stream per direction. NCCL refuses two ranks on one GPU, so this loopback stands in for it, keeping
the rules the executor relies on: a posted op waits for the issuing stream's earlier work (an event
recorded at posting), ``Work.wait()`` orders the current stream after the copy (an event), and
``is_completed()`` queries that event. What it measures for real, on the device: host waits on a
transfer (``Work.wait()`` before the peer posted: the only way this host can wait for one), host waits
on a compute (the run-ahead bound), each receive's copy and each compute timed with device events,
hence the receive overlap; and the logits against an unpipelined forward (wrong ordering on the
streams shows as a difference). What it does not: NCCL itself (kernels, communicator set-up, its
watchdog), two devices' contention, real link bandwidth.

``module``: ``torch.cuda`` (or ``torch.npu``); :class:`HostStreams` stands in on CPU for the dry run
(everything completes at once: it checks the plumbing, not the device).
"""

from __future__ import annotations

import threading
import time

import torch

from vpp.parallel.device import Accelerator
from vpp.parallel.grid import GridSizes
from vpp.parallel.groups import Group, ParallelGroups
from vpp.runtime.device_order import RUN_AHEAD_COMPUTES, StreamOps  # noqa: F401  (RUN_AHEAD_COMPUTES: reported with the counters)


class _HostEvent:
    def __init__(self, enable_timing=True):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def query(self):
        return True

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


class _HostStream:
    def wait_event(self, event):
        pass


class HostStreams:
    """A stand-in for ``torch.cuda`` on CPU: streams and events of work that completes at once."""

    Event = _HostEvent

    def __init__(self):
        self._default = _HostStream()

    def Stream(self, device=None):
        return _HostStream()

    def stream(self, s):
        return _NullContext()

    def current_stream(self, device=None):
        return self._default

    def synchronize(self, device=None):
        pass


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Work:
    def __init__(self, hub, rank):
        self.hub, self.rank = hub, rank
        self.done = None  # event recorded after the copy, once both ends were posted

    def wait(self):
        self.hub.order_after(self)
        return True

    def is_completed(self):
        return self.done is not None and self.done.query()


class Hub:
    """The transfers of a loopback pipeline: the k-th send on (channel, src, dst) meets the k-th
    receive; the later of the two posts enqueues the copy."""

    def __init__(self, module, device):
        self.module, self.device = module, device
        self.cond = threading.Condition()
        self.posted: dict = {}
        self.streams: dict = {}
        self.transfers: list = []  # (dst rank, start event, end event)
        self.computes: list = []  # (rank, stage, start event, end event)
        self.host_transfer_waits = [0, 0]

    def post(self, rank, kind, tensor, peer, channel) -> _Work:
        ready = self.module.Event()
        ready.record()  # the issuing stream's earlier work comes first (ProcessGroupNCCL's syncStream)
        work = _Work(self, rank)
        src, dst = (rank, peer) if kind == "send" else (peer, rank)
        with self.cond:
            ends = self.posted.setdefault((channel, src, dst), {"send": [], "recv": []})
            ends[kind].append((tensor, ready, work))
            k = len(ends[kind]) - 1
            if k < len(ends["recv" if kind == "send" else "send"]):
                self._copy(ends["send"][k], ends["recv"][k], (channel, src, dst), dst)
                self.cond.notify_all()
        return work

    def _copy(self, send, recv, key, dst) -> None:
        (x, ready_s, work_s), (buf, ready_r, work_r) = send, recv
        stream = self.streams.setdefault(key, self.module.Stream(self.device))
        start, done = self.module.Event(enable_timing=True), self.module.Event(enable_timing=True)
        with self.module.stream(stream):
            stream.wait_event(ready_s)
            stream.wait_event(ready_r)
            start.record()
            buf.copy_(x, non_blocking=True)
            done.record()
        work_s.done = work_r.done = done
        self.transfers.append((dst, start, done))

    def order_after(self, work: _Work) -> None:
        if work.done is None:
            with self.cond:
                if work.done is None:
                    self.host_transfer_waits[work.rank] += 1  # the peer has not posted yet
                while work.done is None:
                    self.cond.wait(0.01)
        self.module.current_stream(self.device).wait_event(work.done)


class LoopbackOps(StreamOps):
    """:class:`vpp.runtime.device_order.StreamOps` with its transfers over a :class:`Hub` (events, the
    host's waits and the ordering are the real device path's)."""

    def __init__(self, hub: Hub, rank: int, groups: ParallelGroups):
        super().__init__(hub.module)
        self.hub, self.rank, self.groups = hub, rank, groups

    def _channel(self, group):
        return "up" if group is self.groups.pp_up else "down"

    def isend(self, x, peer, group):
        return self.hub.post(self.rank, "send", x, peer, self._channel(group))

    def irecv(self, buf, peer, group):
        return self.hub.post(self.rank, "recv", buf, peer, self._channel(group))


class TimedStage(torch.nn.Module):
    """A stage whose every call is bracketed by device events on the current stream."""

    def __init__(self, stage, hub: Hub, rank: int, index: int):
        super().__init__()
        self.stage, self.hub, self.rank, self.index = stage, hub, rank, index
        for name in ("layer_range", "hidden_size", "vocab_size", "is_first", "is_last", "dtype", "max_positions"):
            setattr(self, name, getattr(stage, name, None))

    def forward(self, *args, **kw):
        start, end = self.hub.module.Event(enable_timing=True), self.hub.module.Event(enable_timing=True)
        start.record()
        out = self.stage(*args, **kw)
        end.record()
        self.hub.computes.append((self.rank, self.index, start, end))
        return out

    def release(self, request):
        self.stage.release(request)


def pipeline_groups(n: int, r: int, acc: Accelerator, device) -> ParallelGroups:
    """Pipeline rank ``r`` of ``n`` with no process group behind it (every rank in this process)."""
    one = Group.single(r)
    return ParallelGroups(GridSizes(world_size=n, pp=n), r, one, Group(tuple(range(n)), r), one, one, one, acc,
                          device, pp_up=Group(tuple(range(n)), r))


def overlap(hub: Hub, origin, last_stage: int) -> tuple[float, float]:
    """(steady-state, all) fraction of receive copy time during which the receiving rank computed."""
    ms = lambda e: origin.elapsed_time(e) / 1e3  # noqa: E731
    computes = [(r, s, ms(a), ms(b)) for r, s, a, b in hub.computes]
    lo = min(a for r, s, a, b in computes if s == last_stage)
    hi = max(b for r, s, a, b in computes if s == 0)
    out = []
    for steady in (True, False):
        total = covered = 0.0
        for dst, a, b in hub.transfers:
            t0, t1 = ms(a), ms(b)
            if t1 <= t0 or (steady and not lo <= t0 < hi):
                continue
            total += t1 - t0
            covered += sum(max(0.0, min(t1, d) - max(t0, c)) for r, _, c, d in computes if r == dst)
        out.append(covered / total if total > 0 else float("nan"))
    return out[0], out[1]
