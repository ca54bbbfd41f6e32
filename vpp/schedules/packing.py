"""VPP-Async with pipelined packing (the paper's Algorithm 2): the leading chunks of the next request run
in the drain window of the current one, and the plan is still ordinary, verifiable IR.

Why there is a window. In a V, rank 0 holds stage 0 and the last stage. Once request R has fed its last
chunk into stage 0, rank 0 only has R's last-stage computes left, and the last one waits for R's last
chunk to come back through every other stage: under Eq. 2 (tau_k = (k+1) t) with P = 2 rank 0 idles
2 tau_{N-1} - tau_{N-2} = (N+1) t, the drain window, and rank 1 then idles while rank 0 runs the last
stage of C_{N-1}. Run alone (or one request after another, :func:`.builders.build_vpp_async`), every
request pays this drain.

The dual-queue scheduler. Requests are taken in order. Each has two queues of work:

* the first-traversal queue -- its chunks' stages before the fold (stages ``0 .. S/2 - 1``), chunk by
  chunk, leading chunks first;
* the continuation queue -- the stages past the fold (the way back to rank 0, and the last stage).

While the previous request R drains (on each rank: after R's last compute of that stage), the scheduler
pops the head of the next request R''s first-traversal queue into an idle gap of the estimated timeline
of what is already planned -- on rank 0 that gap is R's drain window -- if the task's estimated cost
(plus the part of its send that cannot overlap) fits in the gap and its input is there in time (so no
planned task is delayed). Stage 0 follows Algorithm 2: chunk j is packed while the window left covers
tau'_j; the first chunk that does not fit ends packing for R' (``(N+1) t = 9`` for N = 8, t = 1 holds
C'_0..C'_2, 1 + 2 + 3 = 6, and not C'_3). A packed chunk's later first-traversal stages are packed into
the gaps of their ranks the same way, as long as its previous stage was; a stage that does not fit stops
packing at that stage for the later chunks, so chunks of one request never reorder. Everything left of
R' -- the rest of its first-traversal queue and its continuation queue -- then continues normally: in
R''s own VPP-Async per-rank order, each task as early as a gap of its rank holds it without moving a
planned compute, else after R's work (with P = 2 that is simply after R). Then R' is the request that
drains, and R'' packs into its window (or into what is left of R's, if R' was packed whole).

Packing never delays the request that drains (under the estimate). The cost-unaware alternative,
``build_vpp_async(..., request_order="pipelined")``, lets the next request's chunks overtake the drain
at the slot order's cadence: with P = 2 and linear costs the two coincide; on deeper pipelines the
pipelined order finishes streams a few percent sooner at the price of a slightly later first token for
the draining request (``benchmarks/results/stream_sim.md``).

Estimates. Gaps and fits come from a timed evaluation of the per-rank orders under ``cost`` (the
simulator's cost protocol); without one, from the linear law ``LinearCost.eq2(1, C)`` with C the
largest first chunk (t = 1 per average stage; the window is then (N+1) t for P = 2). The same times
place the communication (:mod:`.comms`, ``at="started"`` for async plans: receives are posted as soon
as the producer starts, which costs nothing and lets each transfer overlap the receiver's compute).

Arrivals and admission. A request's first chunk is never packed before its arrival, nor before the
request ``concurrency`` places earlier has finished (estimated); ``concurrency=1`` turns packing off.
The plan carries ``concurrency`` (the admission gate of :mod:`.ir`); the executor and the simulator hold
the first compute until the request arrives, so an estimate that was too early costs time, never
correctness.

Generality. Any V (any P, any folds): stage 0 and the last stage share rank 0, whose drain window is
the one Algorithm 2 fills; P = 1 never idles, so nothing is packed. An interleaved layout is accepted,
but rank 0's share of R ends before R drains on the other ranks, so R' already follows it there without
packing (no window on rank 0 to fill). A loop layout raises: CPP already runs requests back to back
(:func:`.builders.build_cpp`).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from .builders import _requests, plan_from_orders
from .cost import LinearCost
from .ir import COMPUTE, Plan, Request
from .layout import Layout
from .order import Task, auto_slack, dependencies, last_task, list_schedule, slot_key


def default_cost(layout: Layout, requests: Sequence[Request]) -> LinearCost:
    """The linear law of Algorithm 2 when no cost model is given: tau_k = (k + 1) t per average stage,
    t = 1, for chunks of the largest first-chunk size (stage costs scale with their layer counts)."""
    chunk = max(q.chunk_sizes[0] for q in requests)
    mean = sum(layout.partition) / layout.num_stages
    return LinearCost.eq2(1.0, chunk, stage_weights=tuple(n / mean for n in layout.partition))


@dataclass
class _Slot:
    """A placed compute with its estimated times; ``free`` is when its rank can start the next one (the
    end plus the part of its send that cannot overlap)."""

    task: Task
    start: float
    end: float
    free: float


class _Timeline:
    """Per rank, the planned computes in program order with estimated times."""

    def __init__(self, num_ranks: int):
        self.rows: list[list[_Slot]] = [[] for _ in range(num_ranks)]
        self.at: dict[Task, _Slot] = {}

    def clock(self, rank: int) -> float:
        row = self.rows[rank]
        return row[-1].free if row else 0.0

    def append(self, rank: int, slot: _Slot) -> None:
        self.rows[rank].append(slot)
        self.at[slot.task] = slot

    def fit(self, rank: int, not_before: float, duration: float, busy: float) -> int | None:
        """Index of the first gap between two planned computes of ``rank``, starting no earlier than
        ``not_before``, that holds a compute of ``duration`` plus ``busy`` (its send stall) without
        moving the next one; None if there is none (the end of the row is not a gap)."""
        row = self.rows[rank]
        starts = [s.start for s in row]
        i = max(bisect.bisect_right(starts, not_before) - 1, 0)
        for i in range(i + 1, len(row)):
            begin = max(row[i - 1].free, not_before)
            if begin + duration + busy <= row[i].start:
                return i
        return None

    def insert(self, rank: int, index: int, slot: _Slot) -> None:
        self.rows[rank].insert(index, slot)
        self.at[slot.task] = slot


class _DualQueue:
    """The two queues of one request (see the module docstring): ``first`` holds the stages before the
    fold, chunk-major (leading chunks first); ``continuation`` the stages past the fold. Packing moves
    tasks from ``first`` to ``packed``; whatever is left in both queues then continues normally."""

    def __init__(self, layout: Layout, request: Request):
        fold = layout.num_stages // 2
        chunks = range(request.num_chunks)
        self.request = request
        self.first = deque(Task(s, request.id, c) for c in chunks for s in range(fold))
        self.continuation = deque(Task(s, request.id, c) for c in chunks for s in range(fold, layout.num_stages))
        self.packed: list[Task] = []

    def left(self) -> set[Task]:
        return set(self.first) | set(self.continuation)


class PackingScheduler:
    """Per-rank compute orders of a request stream with pipelined packing, and their estimated times."""

    def __init__(self, layout: Layout, requests: Sequence[Request], cost, *, slack: int | None = None,
                 concurrency: int | None = None):
        self.layout, self.requests, self.cost = layout, tuple(requests), cost
        self.slack = auto_slack(layout, 1) if slack is None else slack
        self.concurrency = concurrency
        self.overlap = float(getattr(cost, "overlap", 1.0))
        self.timeline = _Timeline(layout.num_ranks)
        self.by_id = {q.id: q for q in self.requests}
        self.packed: dict[int, list[Task]] = {}
        self._base: dict[int, tuple[tuple[Task, ...], ...]] = {}
        first = self._duration(Task(0, self.requests[0].id, 0))
        self._floor = 1e-9 * (first if first > 0 else 1.0)  # every estimate needs a positive duration

    # -- costs ------------------------------------------------------------------------------------
    def _duration(self, t: Task) -> float:
        q = self.by_id[t.request]
        d = float(self.cost.compute(t.stage, q.tokens(t.chunk), q.offset(t.chunk)))
        return max(d, getattr(self, "_floor", 0.0))

    def _remote(self, stage: int) -> bool:
        return stage < self.layout.last_stage and not self.layout.is_local_hop(stage)

    def _stall(self, t: Task) -> float:
        """The part of the task's outgoing transfer its rank waits for (async: 1 - overlap of it)."""
        if not self._remote(t.stage):
            return 0.0
        return (1.0 - self.overlap) * float(self.cost.transfer(self.by_id[t.request].tokens(t.chunk)))

    def _ready(self, t: Task) -> float | None:
        """When the task's inputs are there (None while one is not planned yet)."""
        ready = self._admission(t.request) if (t.stage, t.chunk) == (0, 0) else 0.0
        for d in dependencies(t):
            slot = self.timeline.at.get(d)
            if slot is None:
                return None
            arrive = slot.end
            if d.stage != t.stage and self._remote(d.stage):
                arrive += float(self.cost.transfer(self.by_id[d.request].tokens(d.chunk)))
            ready = max(ready, arrive)
        return ready

    def _admission(self, request: int) -> float:
        """Arrival, and with a concurrency limit K the estimated end of the request K places earlier."""
        q = self.by_id[request]
        i = self.requests.index(q)
        ready = q.arrival
        if self.concurrency is not None and i >= self.concurrency:
            ready = max(ready, self.timeline.at[last_task(self.layout, self.requests[i - self.concurrency])].end)
        return ready

    # -- the request's own order --------------------------------------------------------------------
    def base_orders(self, request: Request) -> tuple[tuple[Task, ...], ...]:
        """The request's VPP-Async per-rank compute order, scheduled alone (cached by chunk count)."""
        n = request.num_chunks
        if n not in self._base:
            probe = Request(0, (1,) * n)
            self._base[n] = list_schedule(self.layout, [probe], slot_key(self.layout, [probe], slack=self.slack))[0]
        return tuple(tuple(Task(t.stage, request.id, t.chunk) for t in order) for order in self._base[n])

    # -- Algorithm 2 ----------------------------------------------------------------------------------
    def pack(self, queues: _DualQueue, previous: Request) -> None:
        """Move the leading tasks of the first-traversal queue into the drain gaps of ``previous`` while
        they hold them (stage 0: Algorithm 2's window), in queue order."""
        stopped: set[int] = set()
        for t in list(queues.first):
            if t.stage in stopped or (t.stage > 0 and Task(t.stage - 1, t.request, t.chunk) not in queues.packed):
                if t.stage == 0:
                    return
                stopped.add(t.stage)  # a later chunk may not overtake this one on its stage
                continue
            rank = self.layout.rank_of(t.stage)
            drain = self.timeline.at[Task(t.stage, previous.id, previous.num_chunks - 1)].free
            ready = self._ready(t)
            index = None if ready is None else self.timeline.fit(
                rank, max(ready, drain), self._duration(t), self._stall(t))
            if index is None:
                if t.stage == 0:
                    return  # the window left does not cover tau'_j: R' continues after R
                stopped.add(t.stage)
                continue
            start = max(self.timeline.rows[rank][index - 1].free, ready, drain)
            end = start + self._duration(t)
            self.timeline.insert(rank, index, _Slot(t, start, end, end + self._stall(t)))
            queues.first.remove(t)
            queues.packed.append(t)

    def continue_normally(self, queues: _DualQueue, previous: Request | None) -> None:
        """Place what is left in both queues in the request's own per-rank order: each task, once its
        inputs are planned, goes into the earliest gap of its rank that holds it without moving a planned
        compute (after the request's tasks already on that rank, and after the previous request's last
        compute of the same stage), else after everything planned on the rank."""
        left = queues.left()
        pending = [deque(t for t in order if t in left) for order in self.base_orders(queues.request)]
        after = [max((self.timeline.at[t].free for t in queues.packed if self.layout.rank_of(t.stage) == r),
                     default=0.0) for r in range(self.layout.num_ranks)]
        while any(pending):
            moved = False
            for rank, dq in enumerate(pending):
                while dq:
                    t = dq[0]
                    ready = self._ready(t)
                    if ready is None:
                        break
                    duration, stall = self._duration(t), self._stall(t)
                    not_before = max(ready, after[rank])
                    if previous is not None:
                        not_before = max(not_before, self.timeline.at[
                            Task(t.stage, previous.id, previous.num_chunks - 1)].free)
                    index = self.timeline.fit(rank, not_before, duration, stall) if previous is not None else None
                    if index is None:
                        start = max(self.timeline.clock(rank), ready)
                        slot = _Slot(t, start, start + duration, start + duration + stall)
                        self.timeline.append(rank, slot)
                    else:
                        start = max(self.timeline.rows[rank][index - 1].free, not_before)
                        slot = _Slot(t, start, start + duration, start + duration + stall)
                        self.timeline.insert(rank, index, slot)
                    after[rank] = slot.free
                    dq.popleft()
                    moved = True
            if not moved:
                heads = {r: str(dq[0]) for r, dq in enumerate(pending) if dq}
                raise RuntimeError(f"packing scheduler stuck on request {queues.request.id} (heads {heads})")
        queues.first.clear()
        queues.continuation.clear()

    def run(self) -> "PackingScheduler":
        previous = None
        for q in self.requests:
            queues = _DualQueue(self.layout, q)
            if previous is not None:
                self.pack(queues, previous)
            self.packed[q.id] = list(queues.packed)
            self.continue_normally(queues, previous)
            previous = q
        return self

    # -- results --------------------------------------------------------------------------------------
    def orders(self) -> list[list[Task]]:
        return [[s.task for s in row] for row in self.timeline.rows]

    def times(self) -> tuple[dict[Task, float], dict[Task, float]]:
        at = self.timeline.at
        return {t: s.start for t, s in at.items()}, {t: s.end for t, s in at.items()}


def build_vpp_packed(layout: Layout, requests: Sequence[Request], *, cost=None, concurrency: int | None = None,
                     slack: int | None = None, name: str = "vpp-packed") -> Plan:
    """VPP-Async + pipelined packing (Algorithm 2), see the module docstring. ``cost``: the model that
    estimates the drain windows (default: the linear law, :func:`default_cost`); ``concurrency``: at most
    that many requests in flight (also the plan's admission gate); ``slack``: of each request's own order
    (default: VPP-Async's). The plan is async (non-blocking transfers); it is also deadlock-free with
    blocking and with single-queue semantics (:mod:`.comms`), but estimates ignore rendezvous waits, so
    packing is not offered for blocking plans. With one request (or ``concurrency=1``) the compute orders
    are those of :func:`.builders.build_vpp_async`."""
    requests = _requests(requests)
    if layout.kind == "loop":
        raise ValueError(f"build_vpp_packed fills VPP's drain window, which needs a folded layout ('v' or "
                         f"'interleaved'); got {layout.describe()} -- CPP already runs requests back to back "
                         f"(build_cpp)")
    sched = PackingScheduler(layout, requests, cost if cost is not None else default_cost(layout, requests),
                             slack=slack, concurrency=concurrency).run()
    starts, ends = sched.times()
    return plan_from_orders(layout, requests, sched.orders(), comm="async", name=name, starts=starts, ends=ends,
                            at="started", concurrency=concurrency)


def packed_chunks(plan: Plan) -> dict[int, int]:
    """Per request, how many of its stage-0 computes rank 0 runs before the previous request's last
    compute on rank 0, i.e. inside that request's drain (0 for the first request)."""
    acts = [a for a in plan.actions[plan.layout.rank_of(0)] if a.op == COMPUTE]
    last = {}
    for i, a in enumerate(acts):
        last[a.request] = i
    out = {}
    for prev, q in zip((None,) + plan.requests[:-1], plan.requests):
        if prev is None:
            out[q.id] = 0
            continue
        out[q.id] = sum(1 for a in acts[:last[prev.id]] if a.request == q.id and a.stage == 0)
    return out


__all__ = ["PackingScheduler", "build_vpp_packed", "default_cost", "packed_chunks"]
