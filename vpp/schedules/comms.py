"""Communication placement: per-rank compute orders -> per-rank actions with SEND/RECV/HANDOFF.

The compute orders come with nominal start times: slots of an idealised unit-time model (every compute
takes one slot, transfers are free) -- those of the list schedule that produced them
(:func:`order.list_schedule`), or, for bare orders, each task as soon as it is ready
(:func:`order.nominal_starts`) -- or estimated seconds with their ends (``ends``; a packing builder
estimates them from a cost model). Each activation that crosses ranks becomes one transfer placed at a
nominal time ``T``: the end of its producer (``at="produced"``, the default), the start of its consumer
(``at="needed"``) or the start of its producer (``at="started"``: the receiver posts its receive while
the data is still being computed, the right choice for async plans whose receives cost nothing to post
early; in a blocking plan it would block the receiver). Both ends of the transfer are placed at the
same ``T`` on their ranks: after the rank's computes that start before ``T`` (and, for "started", at
``T``), before the others; transfers that share a ``T`` are ordered by (stage, request, chunk) on every
rank. A local hand-off sits at the same ``T`` on its rank.

Why this cannot deadlock, even with rendezvous (blocking) semantics: sort all events of all ranks by
(time, kind, stage, request, chunk). Every rank's list is this one global sequence restricted to the
rank, and each transfer's two ends sit at the same place in it. Executing the global sequence in order
is therefore a valid run -- when it reaches a transfer both ranks stand at it (the producer's compute
started before ``T``, and with durations > 0 it also ended before any "produced" ``T``), when it
reaches a compute its inputs were delivered earlier (its start is at or after the producer's end) --
and since which send matches which receive is fixed by the plan, every other timing completes too. The
same order also keeps each rank pair's sends and receives FIFO-consistent, and is safe even when all of
a rank's posted operations complete in posting order.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .ir import Action, Request, compute, handoff, recv, send
from .layout import Layout
from .order import Task, dependencies, nominal_starts, rank_tasks

PLACEMENTS = ("produced", "needed", "started")


def check_orders(layout: Layout, requests: Sequence[Request], orders: Sequence[Sequence[Task]]) -> None:
    """Each rank's order holds exactly the tasks of the rank's stages, once each."""
    if len(orders) != layout.num_ranks:
        raise ValueError(f"{len(orders)} compute orders for {layout.num_ranks} ranks")
    for r, order in enumerate(orders):
        want = set(rank_tasks(layout, requests, r))
        got = list(order)
        if len(set(got)) != len(got):
            dup = sorted({t for t in got if got.count(t) > 1})
            raise ValueError(f"rank {r}'s compute order repeats {dup[:3]}")
        if set(got) != want:
            missing, extra = sorted(want - set(got)), sorted(set(got) - want)
            raise ValueError(f"rank {r}'s compute order misses {missing[:3]} ({len(missing)} in all) and has "
                             f"{extra[:3]} ({len(extra)}) not on its stages {layout.stages_of(r)}")


def insert_comms(layout: Layout, requests: Sequence[Request], orders: Sequence[Sequence[Task]], *,
                 starts: Mapping[Task, float] | None = None, ends: Mapping[Task, float] | None = None,
                 at: str = "produced") -> tuple[tuple[Action, ...], ...]:
    """Per-rank actions for per-rank compute ``orders`` (see the module docstring). ``starts`` are the
    nominal start slots (from :func:`order.list_schedule`; by default every task starts when ready) or,
    with ``ends``, estimated start and end times (every end after its start)."""
    if at not in PLACEMENTS:
        raise ValueError(f"at={at!r}; expected one of {PLACEMENTS}")
    check_orders(layout, requests, orders)
    start = nominal_starts(layout, orders) if starts is None else starts
    end = {t: s + 1 for t, s in start.items()} if ends is None else ends
    _checked(layout, orders, start, end)
    events: list[list[tuple[tuple, Action]]] = [[] for _ in range(layout.num_ranks)]
    for r, order in enumerate(orders):
        for t in order:
            events[r].append(((start[t], 2, t), compute(*t)))
            if t.stage == layout.last_stage:
                continue
            consumer = Task(t.stage + 1, t.request, t.chunk)
            when, kind = {"produced": (end[t], 1), "needed": (start[consumer], 1),
                          "started": (start[t], 3)}[at]
            if layout.is_local_hop(t.stage):
                events[r].append(((end[t], 0, t) if at != "started" else (when, kind, t), handoff(*t)))
                continue
            peer = layout.rank_of(t.stage + 1)
            events[r].append(((when, kind, t), send(*t, peer)))
            events[peer].append(((when, kind, t), recv(*t, r)))
    return tuple(tuple(a for _, a in sorted(ev, key=lambda e: e[0])) for ev in events)


def _checked(layout: Layout, orders: Sequence[Sequence[Task]], starts: Mapping[Task, float],
             ends: Mapping[Task, float]) -> None:
    """Nominal times must follow each rank's order without overlap, respect the dependencies, and give
    every task a positive duration."""
    for r, order in enumerate(orders):
        for t in order:
            if not ends[t] > starts[t]:
                raise ValueError(f"nominal end of {t} ({ends[t]}) is not after its start ({starts[t]})")
        for a, b in zip(order, order[1:]):
            if starts[b] < ends[a]:
                raise ValueError(f"rank {r}: nominal start of {b} ({starts[b]}) overlaps {a} "
                                 f"({starts[a]} .. {ends[a]})")
        for t in order:
            for d in dependencies(t):
                if starts[t] < ends[d]:
                    raise ValueError(f"nominal start of {t} ({starts[t]}) precedes the end of its input {d} "
                                     f"({ends[d]})")


__all__ = ["PLACEMENTS", "check_orders", "insert_comms"]
