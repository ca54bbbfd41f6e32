"""Compute order: which (stage, request, chunk) each rank runs, in what order.

A builder is a priority rule plus two passes. The rule is a key over tasks whose first element is the
task's *slot*; :func:`list_schedule` runs the tasks in an idealised unit-time pipeline (every compute
takes one slot, transfers are free) where each rank, in every slot, starts the ready task with the
smallest key among those whose slot has come. That yields per-rank compute orders and nominal start
slots; :func:`vpp.schedules.comms.insert_comms` then places SEND/RECV/HANDOFF. A packing builder can
supply its own key (or its own orders) and reuse both passes.

Dependencies of task (s, q, c): (s-1, q, c), the previous stage's output, and (s, q, c-1), the KV cache
of the same stage. A stage runs its tasks in key order, so a key must grow with the chunk index.
``gates`` add one more dependency to a request's first task (stage 0, chunk 0): the last task of the
request it waits for (the admission gate of ``Plan.concurrency``, :func:`admission_gates`).

The default key is the task's slot in a periodic pipeline (:func:`slot_key`)::

    slot(s, g) = period * group * (g // group) + g % group + depth(s)

``g`` numbers the chunks of all requests in processing order, ``period`` is the number of stages per
rank (the slots a rank needs per chunk), ``depth(s)`` the slots from stage 0 to stage s: one per hop,
plus ``slack`` per remote hop. ``group`` consecutive chunks go through a lap together (Megatron's
interleaved order uses ``group = P``; the V uses 1). :func:`auto_slack` picks the smallest slack (at
least a minimum) for which no two tasks of a rank share a slot, so every rank is busy every slot once
the pipeline is full and the list schedule is exactly the slot order.

* V, ``slack = 0`` (vanilla VPP, Algorithm 1): rank r runs stage r of chunk k in slot 2k + r and stage
  2P-1-r of chunk k in slot 2k + 2P-1-r, one on even and one on odd slots, so the two alternate; for
  P = 2, rank 0 runs ``s0/C0, s0/C1, s3/C0, s0/C2, s3/C1, s0/C3, ...``.
* V, ``slack = 1`` (VPP-Async): every remote hop gets one slot of slack, so each transfer has one compute
  of the receiver to hide behind; for P = 2 rank 0 runs ``s0/C0, s0/C1, s0/C2, s3/C0, s0/C3, s3/C1, ...``
  (the paper's swap of s3/C_{k-1} and s0/C_{k+1}).
* More folds: a W (f = 2) with even P has no conflict-free slot order without slack. Vanilla VPP keeps
  slack 0 and lets the list schedule resolve the conflicts (with blocking transfers, extra slack only
  adds rendezvous waits); VPP-Async takes the smallest conflict-free slack >= 1 (1 for a W).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

from .ir import Request
from .layout import Layout


class Task(NamedTuple):
    """One compute: stage ``stage`` on chunk ``chunk`` of request ``request`` (an id)."""

    stage: int
    request: int
    chunk: int


Key = Callable[[Task], tuple]
"""A priority rule: a tuple whose first element is the task's slot (its earliest nominal start)."""


def chunk_sequence(requests: Sequence[Request]) -> list[tuple[int, int]]:
    """(request id, chunk) of every chunk, in processing order: request after request."""
    return [(q.id, c) for q in requests for c in range(q.num_chunks)]


def hop_depths(layout: Layout, slack: int = 0) -> list[int]:
    """Slots from stage 0 to each stage: 1 per local hop, 1 + slack per remote hop."""
    depth = [0]
    for s in range(layout.num_stages - 1):
        depth.append(depth[-1] + 1 + (0 if layout.is_local_hop(s) else slack))
    return depth


def stages_per_rank(layout: Layout) -> int:
    return max(len(layout.stages_of(r)) for r in range(layout.num_ranks))


def default_group(layout: Layout) -> int:
    """Chunks that go through a lap together: P for Megatron interleaving, else 1."""
    return layout.num_ranks if layout.kind == "interleaved" else 1


def _slot(period: int, group: int, g: int, depth: int) -> int:
    return period * group * (g // group) + g % group + depth


def conflict_free(layout: Layout, slack: int, group: int) -> bool:
    """True if no two tasks of one rank share a slot of :func:`slot_key` (checked over whole periods)."""
    period, depth = stages_per_rank(layout), hop_depths(layout, slack)
    chunks = group * (depth[-1] // (period * group) + 3)
    for r in range(layout.num_ranks):
        slots = [_slot(period, group, g, depth[s]) for s in layout.stages_of(r) for g in range(chunks)]
        if len(set(slots)) != len(slots):
            return False
    return True


def auto_slack(layout: Layout, minimum: int = 0, group: int | None = None) -> int:
    """The smallest slack >= ``minimum`` with a conflict-free slot order (``minimum`` if none is found)."""
    group = default_group(layout) if group is None else group
    for slack in range(minimum, minimum + 2 * stages_per_rank(layout) + 1):
        if conflict_free(layout, slack, group):
            return slack
    return minimum


def slot_key(layout: Layout, requests: Sequence[Request], *, slack: int = 0,
             group: int | None = None) -> Key:
    """The periodic slot key of the module docstring; ties go to the lower stage."""
    if slack < 0:
        raise ValueError(f"slack={slack} must be >= 0")
    group = default_group(layout) if group is None else group
    if group < 1:
        raise ValueError(f"group={group} must be >= 1")
    period, depth = stages_per_rank(layout), hop_depths(layout, slack)
    index = {qc: g for g, qc in enumerate(chunk_sequence(requests))}

    def key(task: Task) -> tuple:
        return (_slot(period, group, index[(task.request, task.chunk)], depth[task.stage]), task.stage)

    return key


def rank_tasks(layout: Layout, requests: Sequence[Request], rank: int) -> list[Task]:
    return [Task(s, q.id, c) for s in layout.stages_of(rank) for q in requests for c in range(q.num_chunks)]


def dependencies(task: Task, gates: Mapping[Task, Task] | None = None) -> Iterable[Task]:
    if task.stage > 0:
        yield Task(task.stage - 1, task.request, task.chunk)
    if task.chunk > 0:
        yield Task(task.stage, task.request, task.chunk - 1)
    if gates and task in gates:
        yield gates[task]


def last_task(layout: Layout, request: Request) -> Task:
    """The request's last compute: the last stage on its last chunk."""
    return Task(layout.last_stage, request.id, request.num_chunks - 1)


def admission_gates(layout: Layout, requests: Sequence[Request], concurrency: int | None) -> dict[Task, Task]:
    """With at most ``concurrency`` requests in flight, request i's first task waits for the last task of
    request i - concurrency (requests admitted in the order given)."""
    if concurrency is None:
        return {}
    if concurrency < 1:
        raise ValueError(f"concurrency={concurrency} must be >= 1 (or None: unlimited)")
    return {Task(0, q.id, 0): last_task(layout, requests[i - concurrency])
            for i, q in enumerate(requests) if i >= concurrency}


def list_schedule(layout: Layout, requests: Sequence[Request], key: Key, *,
                  gates: Mapping[Task, Task] | None = None
                  ) -> tuple[tuple[tuple[Task, ...], ...], dict[Task, int]]:
    """Per-rank compute orders and nominal start slots (see the module docstring)."""
    queues = [[deque(sorted((Task(s, q.id, c) for q in requests for c in range(q.num_chunks)), key=key))
               for s in layout.stages_of(r)] for r in range(layout.num_ranks)]
    keys = {t: key(t) for qs in queues for dq in qs for t in dq}
    end: dict[Task, int] = {}
    start: dict[Task, int] = {}
    orders: list[list[Task]] = [[] for _ in queues]
    left = len(keys)
    now = min((k[0] for k in keys.values()), default=0)
    while left:
        ran, wake = [], []
        for r, qs in enumerate(queues):
            best = None
            for dq in qs:
                if not dq:
                    continue
                t = dq[0]
                ready = max([keys[t][0]] + [end.get(d, 1 << 62) for d in dependencies(t, gates)])
                if ready <= now and (best is None or keys[t] < keys[best[0]]):
                    best = (t, dq)
                elif ready > now:
                    wake.append(ready)
            if best:
                best[1].popleft()
                start[best[0]] = now
                orders[r].append(best[0])
                ran.append(best[0])
        for t in ran:
            end[t] = now + 1
        left -= len(ran)
        later = [w for w in wake if w < 1 << 62]
        if not ran and not later:
            heads = {r: [str(dq[0]) for dq in qs if dq] for r, qs in enumerate(queues) if any(qs)}
            raise ValueError(f"the key's order cannot run (a task waits for one queued behind it): heads {heads}")
        now = now + 1 if ran else max(now + 1, min(later))
    return tuple(tuple(o) for o in orders), start


def nominal_starts(layout: Layout, orders: Sequence[Sequence[Task]], *,
                   gates: Mapping[Task, Task] | None = None) -> dict[Task, int]:
    """Start slot of every task when each takes one slot, ranks follow the given ``orders`` and start a
    task as soon as it is ready. Raises ValueError, naming each rank's blocked task, if the orders cannot
    run together."""
    end: dict[Task, int] = {}
    ptr, clock = [0] * len(orders), [0] * len(orders)
    progress = True
    while progress:
        progress = False
        for r, order in enumerate(orders):
            while ptr[r] < len(order):
                task = order[ptr[r]]
                deps = list(dependencies(task, gates))
                if any(d not in end for d in deps):
                    break
                end[task] = clock[r] = max([clock[r]] + [end[d] for d in deps]) + 1
                ptr[r] += 1
                progress = True
    stuck = [(r, order[ptr[r]]) for r, order in enumerate(orders) if ptr[r] < len(order)]
    if stuck:
        what = "; ".join(f"rank {r} at step {ptr[r]} waits to run F{t.stage}.r{t.request}.c{t.chunk}"
                         for r, t in stuck)
        raise ValueError(f"compute orders cannot run together (a dependency cycle): {what}")
    return {t: e - 1 for t, e in end.items()}


__all__ = [
    "Key", "Task", "admission_gates", "auto_slack", "chunk_sequence", "conflict_free", "default_group",
    "dependencies", "hop_depths", "last_task", "list_schedule", "nominal_starts", "rank_tasks", "slot_key",
    "stages_per_rank",
]
