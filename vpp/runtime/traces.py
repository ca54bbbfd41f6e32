"""Gathering the whole pipeline's trace on every rank."""

from __future__ import annotations

import torch.distributed as dist

from vpp.parallel.groups import ParallelGroups
from vpp.schedules.ir import Plan
from vpp.schedules.trace import Trace

from .executor import ExecutionResult
from .watchdog import rendezvous


def gather_trace(result: ExecutionResult, groups: ParallelGroups, plan: Plan, *, timeout_s: float = 300.0) -> Trace:
    """The whole pipeline's trace, on every rank of it (an ``all_gather_object`` over the pp group,
    after a bounded :func:`~.watchdog.rendezvous` of the instance)."""
    spans = list(result.spans)
    if groups.pp.size > 1:
        rendezvous("gathering the trace", groups.global_rank, groups.members, timeout_s=timeout_s)
        everyone: list = [None] * groups.pp.size
        dist.all_gather_object(everyone, spans, group=groups.pp.pg)
        spans = [s for part in everyone for s in part]
    meta = dict(result.meta, layout=plan.layout.describe(), requests=[list(q.chunk_sizes) for q in plan.requests],
                arrivals=[[q.id, q.arrival] for q in plan.requests])
    return Trace(groups.pp.size, tuple(spans), meta)


__all__ = ["gather_trace"]
