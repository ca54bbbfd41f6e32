"""Gathering the whole pipeline's trace on every rank."""

from __future__ import annotations

import socket
from dataclasses import replace

import torch.distributed as dist

from vpp.parallel.groups import ParallelGroups
from vpp.schedules.ir import Plan
from vpp.schedules.trace import Trace

from .executor import ExecutionResult
from .watchdog import rendezvous


def gather_trace(result: ExecutionResult, groups: ParallelGroups, plan: Plan, *, timeout_s: float = 300.0) -> Trace:
    """The whole pipeline's trace, on every rank of it (an ``all_gather_object`` over the pp group,
    after a bounded :func:`~.watchdog.rendezvous` of the instance). Each rank's spans count from its
    own start; where every rank runs on one host (one monotonic clock) they are moved to the earliest
    rank's origin, so times compare across ranks (ranks start their runs a little apart, more on a busy
    machine). Ranks on several hosts keep their own origins."""
    spans = list(result.spans)
    if groups.pp.size > 1:
        rendezvous("gathering the trace", groups.global_rank, groups.members, timeout_s=timeout_s)
        everyone: list = [None] * groups.pp.size
        dist.all_gather_object(everyone, (spans, result.origin, socket.gethostname()), group=groups.pp.pg)
        base = min(origin for _, origin, _ in everyone)
        one_host = len({host for _, _, host in everyone}) == 1
        spans = [replace(s, start=s.start + shift, end=s.end + shift) if shift else s
                 for part, origin, _ in everyone for shift in [origin - base if one_host else 0.0] for s in part]
    meta = dict(result.meta, layout=plan.layout.describe(), requests=[list(q.chunk_sizes) for q in plan.requests],
                arrivals=[[q.id, q.arrival] for q in plan.requests])
    return Trace(groups.pp.size, tuple(spans), meta)


__all__ = ["gather_trace"]
