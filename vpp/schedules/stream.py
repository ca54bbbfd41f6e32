"""Request-stream metrics from a trace and its plan: completion, TTFT, throughput, drain idle, KV lifetimes.

Definitions (times on the trace's clock, whose origin is the stream start, as the simulator writes it):

* done(q)      -- the end of the last stage's compute of q's last chunk: q's first token exists.
* admitted(q)  -- when the client hands q over: its arrival, and with ``Plan.concurrency = K`` no earlier
  than done of the request K places before it (a client that keeps at most K requests outstanding, as
  ``vllm bench serve --max-concurrency`` does, starts its TTFT clock when it sends the request).
* TTFT(q)      -- done(q) - admitted(q). Without a concurrency limit, done(q) - arrival(q).
* throughput   -- total prompt tokens / (last done - first arrival).
* drain window -- of every request R that has a successor in the plan: from the end of stage 0 on R's
  last chunk (R has entered the pipeline completely; Algorithm 2's drain phase) to done(R).
  :func:`drain_idle` sums, over ranks, the bubble (idle that is not waiting for work, see
  :mod:`.summary`) inside the union of these windows: the idle that pipelined packing can fill.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from .ir import Plan
from .summary import timeline
from .trace import Trace


def request_done_times(trace: Trace, plan: Plan) -> dict[int, float]:
    """Request id -> end of the last stage's compute of its last chunk."""
    last = plan.layout.last_stage
    want = {q.id: q.num_chunks - 1 for q in plan.requests}
    out: dict[int, float] = {}
    for s in trace.spans:
        if s.kind == "compute" and s.stage == last and want.get(s.request) == s.chunk:
            out[s.request] = max(out.get(s.request, s.end), s.end)
    missing = [q for q in want if q not in out]
    if missing:
        raise ValueError(f"the trace has no last-stage compute of the last chunk of requests {missing[:5]} "
                         f"(stage {last}); was it recorded from this plan?")
    return out


def admission_times(plan: Plan, done: dict[int, float]) -> dict[int, float]:
    """Request id -> when it was handed over: arrival, or the end of the request ``concurrency`` places
    before it if that is later."""
    out = {}
    for i, q in enumerate(plan.requests):
        at = q.arrival
        if plan.concurrency is not None and i >= plan.concurrency:
            at = max(at, done[plan.requests[i - plan.concurrency].id])
        out[q.id] = at
    return out


def request_ttft(trace: Trace, plan: Plan) -> dict[int, float]:
    """Request id -> time to first token (done - admitted, see the module docstring)."""
    done = request_done_times(trace, plan)
    admitted = admission_times(plan, done)
    return {q: done[q] - admitted[q] for q in done}


@dataclass(frozen=True)
class StreamStats:
    """Per-stream numbers: ``ttft`` per request id, its median / p90 / mean, tokens and throughput."""

    requests: int
    tokens: int
    makespan: float
    throughput: float
    ttft: dict
    ttft_median: float
    ttft_p90: float
    ttft_mean: float

    def to_dict(self) -> dict:
        return {"requests": self.requests, "tokens": self.tokens, "makespan": self.makespan,
                "throughput": self.throughput, "ttft_median": self.ttft_median, "ttft_p90": self.ttft_p90,
                "ttft_mean": self.ttft_mean, "ttft": {str(q): t for q, t in self.ttft.items()}}


def stream_stats(trace: Trace, plan: Plan) -> StreamStats:
    """TTFT statistics (median, p90 by linear interpolation) and throughput of the stream."""
    done = request_done_times(trace, plan)
    ttft = request_ttft(trace, plan)
    tokens = sum(q.new_tokens for q in plan.requests)
    span = max(done.values()) - min(q.arrival for q in plan.requests)
    values = list(ttft.values())
    return StreamStats(len(plan.requests), tokens, span, tokens / span if span > 0 else float("inf"), ttft,
                       percentile(values, 50), percentile(values, 90), sum(values) / len(values))


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile with linear interpolation between order statistics (numpy's default)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * p / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def drain_windows(trace: Trace, plan: Plan) -> list[tuple[int, float, float]]:
    """(request id, start, end) of the drain window of every request with a successor (module docstring)."""
    done = request_done_times(trace, plan)
    entered = {}
    last = {q.id: q.num_chunks - 1 for q in plan.requests}
    for s in trace.spans:
        if s.kind == "compute" and s.stage == 0 and last.get(s.request) == s.chunk:
            entered[s.request] = s.end
    return [(q.id, entered[q.id], done[q.id]) for q in plan.requests[:-1]]


def drain_idle(trace: Trace, plan: Plan) -> float:
    """Bubble time, summed over ranks, inside the union of the drain windows (module docstring)."""
    windows = sorted((a, b) for _, a, b in drain_windows(trace, plan) if b > a)
    merged: list[list[float]] = []
    for a, b in windows:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    starts, ends = [w[0] for w in merged], [w[1] for w in merged]
    total = 0.0
    for segs in timeline(trace):
        for kind, a, b, _ in segs:
            if kind == "bubble":  # the windows that can overlap [a, b] (the others add 0.0): sorted, disjoint
                lo, hi = bisect.bisect_right(ends, a), bisect.bisect_left(starts, b)
                total += sum(max(0.0, min(b, w1) - max(a, w0)) for w0, w1 in merged[lo:hi])
    return total


def live_requests(trace: Trace, plan: Plan, *, free: str = "request") -> int:
    """The most requests whose KV caches coexist on one stage. A request's cache on a stage is allocated
    by its first compute there and freed when the request finishes (``free="request"``: done(q), the
    end of its last compute anywhere) or, in a prefill-only run, once the stage has run its last chunk
    (``free="stage"``). A cache freed at the instant another is allocated does not overlap it."""
    if free not in ("request", "stage"):
        raise ValueError(f"free={free!r}; expected 'request' or 'stage'")
    done = request_done_times(trace, plan)
    last = {q.id: q.num_chunks - 1 for q in plan.requests}
    first: dict[tuple, float] = {}
    freed: dict[tuple, float] = {}
    for s in trace.spans:
        if s.kind != "compute" or s.request not in last:
            continue
        key = (s.stage, s.request)
        first[key] = min(first.get(key, s.start), s.start)
        if s.chunk == last[s.request]:
            freed[key] = s.end
    most = 0
    for stage in {k[0] for k in first}:
        events = []
        for (st, q), a in first.items():
            if st == stage:
                events += [(a, 1), (done[q] if free == "request" else freed[(st, q)], -1)]
        live = 0
        for _, step in sorted(events):
            live += step
            most = max(most, live)
    return most


__all__ = [
    "StreamStats", "admission_times", "drain_idle", "drain_windows", "live_requests", "percentile",
    "request_done_times", "request_ttft", "stream_stats",
]
