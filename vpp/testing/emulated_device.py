"""An emulated device on CPU that enforces NCCL's ordering rules in virtual time, for running the real
executor's stream-ordered path (:mod:`vpp.runtime.device_order`) where no accelerator is (:mod:`.emulated_run`
runs it). Nothing runs on a real device: every enqueued operation becomes a node with dependencies, and
its start and end are resolved in virtual seconds as soon as its dependencies are.

The rules (those of CUDA streams and ProcessGroupNCCL):

* **streams run in order.** A rank has one compute stream (the current stream) and, by ``streams``:
  ``"pair"`` one stream per pair communicator (a (channel, lower rank, higher rank) triple, as
  ProcessGroupNCCL keys its lazily created p2p communicators); ``"group"`` one per process group (NCCL
  initialised eagerly with ``device_id=``, and HCCL: a group's p2p runs on its one communicator, set up
  at init); ``"rank"`` one for all of a rank's transfers. An operation starts after the previous one
  on its stream has ended; a batch (``batch_isend_irecv``, :meth:`EmulatedDevice.post_batch`) takes
  one place on its stream, its transfers run together.
* **collectives** (:meth:`EmulatedDevice.collective`) run on the compute stream, all members together;
  the first on a group sets its communicator up (lazy creation: the host blocks until every member
  arrives) unless it was warmed.
* **a point-to-point op waits for the issuing stream's earlier work** (ProcessGroupNCCL's
  ``syncStream``): it depends on the compute stream's last operation at the moment it was posted.
* **a transfer is a rendezvous:** the k-th send on (channel, src, dst) matches the k-th receive; both
  start when both sides are ready and end ``cost.transfer(tokens)`` later.
* **the first op on a pair communicator blocks the host** until the peer posts its counterpart (lazy
  communicator set-up): a host-blocking wait on a transfer, unless the pair was warmed.
* **a received tensor is usable only after its op completes:** a compute whose input is a receive
  buffer or a view of one (a split step's pieces: compared by storage, not identity) raises :class:`EmulationError` unless the receive is ordered before it on the device (a
  ``Work.wait()`` reaches it through the compute stream's dependencies) or the host has waited for it.
* **compute takes the cost model's time:** stage ``s`` on ``tokens`` tokens after ``prefix`` takes
  ``cost.compute(s, tokens, prefix)`` (a :mod:`vpp.schedules.cost` model).
* **the host's clock** advances only when it waits for the device (:meth:`EmulatedOps.host_wait`); an
  operation cannot start before the host time at which it was enqueued. Host work itself is free.

``Work.is_completed()`` and ``Event.query()`` answer against the asking rank's host clock (the op has
ended in virtual time at or before it), and only from a thread that selected the rank's device
(:meth:`EmulatedDevice.select_device`; CUDA would create a context on device 0, an NPU query fails).

Timeouts and teardown (ProcessGroupNCCL's watchdog): a transfer still unmatched ``pg_timeout_s`` of
wall time after it was posted (its clock starts at enqueue, as NCCL's does) completes with an error
(``Work.exception()``, ``is_completed()`` true), as a failed NCCL work does; :meth:`EmulatedDevice.abort`
(a rank's ``ProcessGroup.abort()``) fails that rank's unfinished transfers at once. ``store``: an
in-memory key-value store shared by the ranks (the failure notices of :mod:`vpp.runtime.watchdog`).

Counters (per rank): ``host_transfer_waits`` -- the host blocked on a transfer (communicator set-up, or
a host-side wait for a Work); ``host_compute_waits`` -- the run-ahead bound; ``end_waits``. Measures of
the timeline: the makespan, and ``recv_overlap``, the fraction of all receives' transfer time during
which the receiving rank's compute stream was busy.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch


def _storage(x: torch.Tensor) -> int:
    """The address of ``x``'s storage: a view (a split step's piece) and its buffer share it."""
    return x.untyped_storage().data_ptr()


class EmulationError(RuntimeError):
    """An operation broke one of NCCL's rules, or the emulated ranks could not progress."""


@dataclass(eq=False)
class _Op:
    rank: int
    kind: str  # "compute" | "send" | "recv" | "marker"
    label: str
    deps: list
    earliest: float  # host time at enqueue
    duration: float = 0.0
    peer_op: "_Op | None" = None  # the other end of a transfer, once matched
    stage: int | None = None  # of a compute
    start: float | None = None
    end: float | None = None
    group_ops: list | None = None  # a collective's calls on every member, once all are posted
    posted_wall: float = 0.0  # time.monotonic() at enqueue: the process group's own timeout counts from it
    error: BaseException | None = None  # a transfer that failed (timed out, or its communicator aborted)


class _Work:
    """What ``dist.isend``/``irecv`` return on NCCL, emulated: ``wait()`` orders the current stream."""

    def __init__(self, device: "EmulatedDevice", op: _Op):
        self.device, self.op = device, op

    def wait(self) -> bool:
        if self.op.error is not None:
            raise self.op.error
        self.device.order_after(self.op.rank, self.op)
        return True

    def is_completed(self) -> bool:
        return self.device.is_done(self.op.rank, self.op)

    def exception(self):
        return self.op.error


class _Event:
    def __init__(self, device: "EmulatedDevice", op: _Op):
        self.device, self.op = device, op

    def query(self) -> bool:
        return self.device.is_done(self.op.rank, self.op)


@dataclass
class RankCounters:
    host_transfer_waits: int = 0
    host_compute_waits: int = 0
    end_waits: int = 0


class MemoryStore:
    """The parts of a ``torch.distributed.Store`` the watchdog uses, in memory, for threads."""

    def __init__(self):
        self.data, self.lock = {}, threading.Lock()

    def set(self, key, value):
        with self.lock:
            self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        with self.lock:
            return self.data[key]

    def check(self, keys):
        with self.lock:
            return all(k in self.data for k in keys)

    def compare_set(self, key, expected, value):
        with self.lock:
            if self.data.get(key, b"").decode() == expected:
                self.data[key] = value.encode()
            return self.data[key]


class EmulatedDevice:
    """The shared timeline of ``num_ranks`` emulated ranks (see the module docstring)."""

    STREAMS = ("pair", "group", "rank")

    def __init__(self, num_ranks: int, cost, *, timeout_s: float = 60.0, pg_timeout_s: float | None = None,
                 streams: str = "pair"):
        if streams not in self.STREAMS:
            raise ValueError(f"streams={streams!r}: choose one of {self.STREAMS}")
        self.n, self.cost, self.timeout_s, self.streams = num_ranks, cost, timeout_s, streams
        self.pg_timeout_s = pg_timeout_s if pg_timeout_s is not None else timeout_s
        self.store = MemoryStore()
        self.selected = threading.local()  # the calling thread's current device (a rank), see select_device
        self.aborted: set[int] = set()
        self.cond = threading.Condition()
        self.host = [0.0] * num_ranks
        self.tail: dict = {}  # stream -> its last op
        self.posted: dict = {}  # (channel, src, dst) -> {"send": [ops], "recv": [ops]}
        self.tensors: dict = {}  # op -> (send tensor or receive buffer)
        self.producer: dict[int, tuple] = {}  # storage address of a receive buffer -> (buffer, its receive)
        self.ops: list[_Op] = []
        self.unresolved: list[_Op] = []
        self.warmed: set = set()
        self.arrived: dict = {}  # pair communicator -> {rank: host time} while it is being set up
        self.counters = [RankCounters() for _ in range(num_ranks)]
        self.origin = 0.0

    # --- enqueueing ---------------------------------------------------------------------------------

    def _enqueue(self, rank: int, stream, kind: str, label: str, deps: list, duration: float = 0.0) -> _Op:
        prev = self.tail.get(stream)
        op = _Op(rank, kind, label, [d for d in [prev, *deps] if d is not None], self.host[rank], duration)
        self.tail[stream] = op
        self.ops.append(op)
        self.unresolved.append(op)
        return op

    def compute(self, rank: int, label: str, duration: float, inputs=(), stage: int | None = None) -> _Op:
        with self.cond:
            for x in inputs:
                entry = self.producer.get(_storage(x))
                recv = entry[1] if entry is not None else None
                if recv is not None and not self._ordered_before(rank, recv):
                    raise EmulationError(f"rank {rank}: {label} reads the buffer of {recv.label} before that "
                                         f"receive is ordered before it (no Work.wait() on the current stream, "
                                         f"no host wait)")
            op = self._enqueue(rank, ("compute", rank), "compute", label, [], duration)
            op.stage = stage
            self._resolve()
            return op

    def marker(self, rank: int, label: str, after: _Op | None = None) -> _Op:
        """A zero-time op on the compute stream (an event record, or a wait on ``after``)."""
        with self.cond:
            op = self._enqueue(rank, ("compute", rank), "marker", label, [after] if after is not None else [])
            self._resolve()
            return op

    def order_after(self, rank: int, op: _Op) -> None:
        self.marker(rank, f"wait({op.label})", op)

    def _stream(self, rank: int, channel: str, lo: int, hi: int):
        if self.streams == "pair":
            return ("comm", rank, (channel, lo, hi))
        return ("comm", rank, channel) if self.streams == "group" else ("comm", rank)

    def post(self, rank: int, kind: str, tensor: torch.Tensor, peer: int, channel: str, label: str) -> _Work:
        return self.post_batch(rank, [(kind, tensor, peer, channel, label)])[0]

    def post_batch(self, rank: int, items) -> list[_Work]:
        """Post transfers ``(kind, tensor, peer, channel, label)``; several: one ``batch_isend_irecv``
        (one place on each stream it uses; its transfers run together)."""
        with self.cond:
            made, tails = [], {}
            for kind, tensor, peer, channel, label in items:
                src, dst = (rank, peer) if kind == "send" else (peer, rank)
                comm = (channel, min(src, dst), max(src, dst))
                if self.streams == "pair" and comm not in self.warmed:
                    self._set_up(rank, comm, 2)
                stream = self._stream(rank, channel, *comm[1:])
                if stream not in tails:
                    tails[stream] = self.tail.get(stream)
                op = _Op(rank, kind, label, [d for d in (tails[stream], self.tail.get(("compute", rank))) if d],
                         self.host[rank])
                op.posted_wall = time.monotonic()
                self.ops.append(op)
                self.unresolved.append(op)
                made.append((stream, op))
                ends = self.posted.setdefault((channel, src, dst), {"send": [], "recv": []})
                ends[kind].append(op)
                self.tensors[op] = tensor
                if kind == "recv":
                    self.producer[_storage(tensor)] = (tensor, op)  # held: its address is never reused
                k = len(ends[kind]) - 1
                other = ends["recv" if kind == "send" else "send"]
                if k < len(other):
                    self._match(ends["send"][k], ends["recv"][k])
            for stream in tails:  # the batch's end: the next op on the stream follows all of it
                members = [op for s, op in made if s == stream]
                if len(members) == 1:
                    self.tail[stream] = members[0]
                else:
                    end = _Op(rank, "marker", "batch end", members, self.host[rank])
                    self.ops.append(end)
                    self.unresolved.append(end)
                    self.tail[stream] = end
            self._resolve()
            self.cond.notify_all()
            return [_Work(self, op) for _, op in made]

    def collective(self, rank: int, group: str, members: tuple[int, ...], label: str, duration: float = 0.0) -> _Work:
        """A collective of ``members`` on ``rank``'s compute stream (NCCL runs it there); the k-th call
        on ``group`` of every member runs together. The first on a group sets its communicator up."""
        with self.cond:
            if (group,) not in self.warmed:
                self._set_up(rank, (group,), len(members))
            op = self._enqueue(rank, ("compute", rank), "collective", label, [], duration)
            calls = self.posted.setdefault(("collective", group), {})
            calls.setdefault(rank, []).append(op)
            k = len(calls[rank]) - 1
            if all(len(calls.get(m, ())) > k for m in members):
                peers = [calls[m][k] for m in members]
                for p in peers:
                    p.group_ops = peers
            self._resolve()
            return _Work(self, op)

    def _set_up(self, rank: int, comm, members: int) -> None:
        """Lazy communicator set-up: the host blocks until every member reaches the same communicator."""
        arrived = self.arrived.setdefault(comm, {})
        arrived[rank] = self.host[rank]
        self.cond.notify_all()
        deadline = time.monotonic() + self.timeout_s
        while len(arrived) < members:
            if time.monotonic() > deadline:
                raise EmulationError(f"rank {rank} waited {self.timeout_s:g}s to set up communicator {comm}")
            self.cond.wait(0.05)
        self.host[rank] = max(arrived.values())
        self.counters[rank].host_transfer_waits += 1
        self.warmed.add(comm)

    def _match(self, send: _Op, recv: _Op) -> None:
        x, buf = self.tensors[send], self.tensors[recv]
        if x.shape != buf.shape or x.dtype != buf.dtype:
            raise EmulationError(f"{send.label} sends {tuple(x.shape)} {x.dtype} but {recv.label} receives "
                                 f"{tuple(buf.shape)} {buf.dtype}")
        buf.copy_(x)
        duration = float(self.cost.transfer(int(x.shape[0]) if x.dim() else 1))
        send.peer_op, recv.peer_op = recv, send
        send.duration = recv.duration = duration

    # --- resolving times ----------------------------------------------------------------------------

    def _ready(self, op: _Op) -> float | None:
        if any(d.end is None for d in op.deps):
            return None
        return max([op.earliest, *(d.end for d in op.deps)])

    def _resolve(self) -> None:
        progress = True
        while progress:
            progress = False
            for op in list(self.unresolved):
                if op.end is not None:
                    self.unresolved.remove(op)
                    continue
                ready = self._ready(op)
                if ready is None:
                    continue
                if op.kind == "collective":
                    if op.group_ops is None or any(self._ready(o) is None for o in op.group_ops):
                        continue
                    start = max(self._ready(o) for o in op.group_ops)
                    for o in op.group_ops:
                        o.start, o.end = start, start + o.duration
                elif op.kind in ("send", "recv"):
                    other = op.peer_op
                    other_ready = None if other is None else self._ready(other)
                    if other_ready is None:
                        continue
                    start = max(ready, other_ready)
                    for o in (op, other):
                        o.start, o.end = start, start + op.duration
                else:
                    op.start, op.end = ready, ready + op.duration
                self.unresolved.remove(op)
                progress = True
        self.cond.notify_all()

    def _ordered_before(self, rank: int, target: _Op) -> bool:
        if target.end is not None and target.end <= self.host[rank]:
            return True
        stack, seen = [self.tail.get(("compute", rank))], set()
        while stack:
            op = stack.pop()
            if op is None or id(op) in seen:
                continue
            if op is target:
                return True
            seen.add(id(op))
            stack.extend(op.deps)
        return False

    # --- the host -----------------------------------------------------------------------------------

    def select_device(self, rank: int, *, host: bool = False) -> None:
        """``torch.cuda.set_device`` on the calling thread: its queries are now on ``rank``'s device.
        ``host``: the thread is the rank's host thread, whose answers follow its virtual clock; another
        thread (the watchdog) sees an op done once it has ended at all (the device runs on while the
        host sleeps in real time, e.g. until a request arrives)."""
        self.selected.rank, self.selected.host = rank, host

    def abort(self, rank: int) -> None:
        """``ProcessGroup.abort()`` on ``rank``: its unfinished transfers fail at once (kernels stop)."""
        with self.cond:
            self.aborted.add(rank)
            for op in self.unresolved:
                if op.rank == rank and op.kind in ("send", "recv") and op.error is None:
                    op.error = RuntimeError(f"rank {rank}'s communicator was aborted")
            self.cond.notify_all()

    def is_done(self, rank: int, op: _Op) -> bool:
        if getattr(self.selected, "rank", None) != rank:
            raise EmulationError(f"a thread queried rank {rank}'s work on device "
                                 f"{getattr(self.selected, 'rank', 0)}: set the device first (CUDA makes a "
                                 f"context there, an NPU query fails)")
        with self.cond:
            if op.error is not None:
                return True
            if op.kind in ("send", "recv") and op.end is None and \
                    time.monotonic() - op.posted_wall > self.pg_timeout_s:
                op.error = RuntimeError(f"Watchdog caught collective operation timeout: {op.label} ran for "
                                        f"{1000 * (time.monotonic() - op.posted_wall):.0f} ms, over the process "
                                        f"group's {self.pg_timeout_s:g} s")
                return True
            return op.end is not None and (op.end <= self.host[rank] or not getattr(self.selected, "host", False))

    def host_wait(self, rank: int, op: _Op, check, counter: str) -> None:
        """The host of ``rank`` blocks until ``op`` has ended (its clock moves to the end)."""
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            setattr(self.counters[rank], counter, getattr(self.counters[rank], counter) + 1)
            while op.end is None:
                check()
                if time.monotonic() > deadline:
                    raise EmulationError(f"rank {rank} waited {self.timeout_s:g}s for {op.label}, which never ran")
                self.cond.wait(0.02)
            self.host[rank] = max(self.host[rank], op.end)

    def start_epoch(self) -> None:
        """After a warm-up: move every clock to the end of all work so far and zero the counters."""
        with self.cond:
            if self.unresolved:
                raise EmulationError(f"{len(self.unresolved)} operations unresolved at the start of an epoch")
            self.origin = max([0.0, *self.host, *(op.end for op in self.ops)])
            self.host = [self.origin] * self.n
            self.counters = [RankCounters() for _ in range(self.n)]
            self.ops = []
            self.tail = {k: self.marker_at(k) for k in self.tail}

    def marker_at(self, stream) -> _Op:
        op = _Op(stream[1], "marker", "epoch", [], self.origin)
        op.start = op.end = self.origin
        return op

    # --- measures -----------------------------------------------------------------------------------

    def makespan(self) -> float:
        return max([self.origin, *(op.end for op in self.ops)]) - self.origin

    def steady_window(self) -> tuple[float, float]:
        """The pipeline's steady state: from the first compute of the last stage (the fill is over) to
        the end of the last compute of stage 0 (the drain begins)."""
        computes = [op for op in self.ops if op.kind == "compute"]
        last = max(op.stage for op in computes)
        return (min(op.start for op in computes if op.stage == last),
                max(op.end for op in computes if op.stage == 0))

    def recv_overlap(self, steady: bool = True, keep=None) -> float:
        """Transfer time of the receives during which the receiving rank computed, over their total
        transfer time; ``steady``: only receives that start inside :meth:`steady_window` (in the fill
        and the drain a rank may have nothing to compute while its input travels: a bubble, not a
        receive held back); ``keep(label)``: only the receives whose label it accepts."""
        busy: dict[int, list] = {}
        for op in self.ops:
            if op.kind == "compute" and op.duration > 0:
                busy.setdefault(op.rank, []).append((op.start, op.end))
        lo, hi = self.steady_window() if steady else (float("-inf"), float("inf"))
        total = covered = 0.0
        for op in self.ops:
            if op.kind != "recv" or op.duration <= 0 or not lo <= op.start < hi or (keep and not keep(op.label)):
                continue
            total += op.end - op.start
            covered += sum(max(0.0, min(op.end, b) - max(op.start, a)) for a, b in busy.get(op.rank, ()))
        return covered / total if total > 0 else 1.0


__all__ = ["EmulatedDevice", "EmulationError", "MemoryStore", "RankCounters"]
