"""Compute order: which (stage, request, chunk) each rank runs, in what order.

A builder is a priority rule plus two passes. The rule is a sort key over tasks; :func:`orders_from_key`
sorts each rank's tasks by it (this module), and :func:`vpp.schedules.comms.insert_comms` turns the
per-rank compute orders into actions with SEND/RECV/HANDOFF placed. A packing builder can supply its own
key (or its own orders) and reuse the second pass.

Dependencies of task (s, q, c): (s-1, q, c), the previous stage's output, and (s, q, c-1), the KV cache
of the same stage. Requests are independent of each other except through the order of the ranks.

The default key is the task's slot in an idealised unit-time pipeline (:func:`slot_key`)::

    key(s, g) = period * group * (g // group) + g % group + depth(s)

``g`` numbers the chunks of all requests in processing order, ``period`` is the number of stages per
rank (the slots a rank needs per chunk), ``depth(s)`` the slots from stage 0 to stage s: one per hop,
plus ``slack`` per remote hop. ``group`` consecutive chunks go through a lap together (Megatron's
interleaved order uses ``group = P``; the V uses 1). The key strictly increases along both dependencies,
so sorting every rank by it yields orders that can run together (one global order exists).

* V, ``slack = 0`` (vanilla VPP, Algorithm 1): rank r runs stage r of chunk k in slot 2k + r and stage
  2P-1-r of chunk k in slot 2k + 2P-1-r, one on even and one on odd slots, so the two alternate; for
  P = 2, rank 0 runs ``s0/C0, s0/C1, s3/C0, s0/C2, s3/C1, s0/C3, ...``.
* V, ``slack = 1`` (VPP-Async): every remote hop gets one slot of slack, so each transfer has one compute
  of the receiver to hide behind; for P = 2 rank 0 runs ``s0/C0, s0/C1, s0/C2, s3/C0, s0/C3, s3/C1, ...``
  (the paper's swap of s3/C_{k-1} and s0/C_{k+1}).
"""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple, Sequence

from .ir import Request
from .layout import Layout


class Task(NamedTuple):
    """One compute: stage ``stage`` on chunk ``chunk`` of request ``request`` (an id)."""

    stage: int
    request: int
    chunk: int


Key = Callable[[Task], tuple]
"""A priority rule: ranks run their tasks in increasing key order. By convention the key's first element
is the task's slot, its earliest start in the unit-time model that places the transfers (:mod:`.comms`)."""


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


def slot_key(layout: Layout, requests: Sequence[Request], *, slack: int = 0,
             group: int | None = None) -> Key:
    """The unit-time slot key of the module docstring; ties (same slot, same rank) go to the lower stage."""
    if slack < 0:
        raise ValueError(f"slack={slack} must be >= 0")
    group = default_group(layout) if group is None else group
    if group < 1:
        raise ValueError(f"group={group} must be >= 1")
    period = stages_per_rank(layout)
    depth = hop_depths(layout, slack)
    index = {qc: g for g, qc in enumerate(chunk_sequence(requests))}

    def key(task: Task) -> tuple:
        g = index[(task.request, task.chunk)]
        return (period * group * (g // group) + g % group + depth[task.stage], task.stage)

    return key


def rank_tasks(layout: Layout, requests: Sequence[Request], rank: int) -> list[Task]:
    return [Task(s, q.id, c) for s in layout.stages_of(rank) for q in requests for c in range(q.num_chunks)]


def orders_from_key(layout: Layout, requests: Sequence[Request], key: Key) -> tuple[tuple[Task, ...], ...]:
    """Each rank's tasks sorted by ``key``."""
    return tuple(tuple(sorted(rank_tasks(layout, requests, r), key=key)) for r in range(layout.num_ranks))


def release_slots(layout: Layout, requests: Sequence[Request], key: Key) -> dict[Task, int]:
    """Each task's slot, the first element of its key."""
    return {t: int(key(t)[0]) for r in range(layout.num_ranks) for t in rank_tasks(layout, requests, r)}


def dependencies(task: Task) -> Iterable[Task]:
    if task.stage > 0:
        yield Task(task.stage - 1, task.request, task.chunk)
    if task.chunk > 0:
        yield Task(task.stage, task.request, task.chunk - 1)


def nominal_starts(layout: Layout, orders: Sequence[Sequence[Task]],
                   release: dict[Task, int] | None = None) -> dict[Task, int]:
    """Start slot of every task when each takes one slot, ranks follow ``orders``, transfers are free
    and no task starts before its ``release`` slot (a key's slot; default: as soon as possible).

    Raises ValueError, naming each rank's blocked task, if the orders cannot run together.
    """
    end: dict[Task, int] = {}
    ptr = [0] * len(orders)
    clock = [0] * len(orders)
    progress = True
    while progress:
        progress = False
        for r, order in enumerate(orders):
            while ptr[r] < len(order):
                task = order[ptr[r]]
                deps = list(dependencies(task))
                if any(d not in end for d in deps):
                    break
                start = max([clock[r], release.get(task, 0) if release else 0] + [end[d] for d in deps])
                end[task] = clock[r] = start + 1
                ptr[r] += 1
                progress = True
    stuck = [(r, order[ptr[r]]) for r, order in enumerate(orders) if ptr[r] < len(order)]
    if stuck:
        what = "; ".join(f"rank {r} at step {ptr[r]} waits to run F{t.stage}.r{t.request}.c{t.chunk}"
                         for r, t in stuck)
        raise ValueError(f"compute orders cannot run together (a dependency cycle): {what}")
    return {t: e - 1 for t, e in end.items()}
