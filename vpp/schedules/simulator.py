"""The simulator: interprets a plan against a cost model and returns a :class:`Trace`.

It runs the same semantics as the verifier (:mod:`.engine`) with durations from the cost model: a
COMPUTE of stage s on chunk c of request q takes ``cost.compute(s, tokens, prefix)`` with the chunk's
token count and its offset in the request as prefix; a transfer takes ``cost.transfer(tokens)``; a
HANDOFF is free. The pieces of a step shared by several requests (``Plan.steps``) take what
:func:`.cost.piece_times` gives: by default each piece's own compute, less the per-step overhead
(:func:`.cost.step_overhead`) for every piece but the lead, so the overhead is paid once per step; a
model with ``step_compute`` (one batched forward, :mod:`vpp.perf.batched`) splits the step its own way.
The step's one transfer carries its tokens (one latency). Blocking plans rendezvous (both ranks are
blocked from arrival until the transfer ends); async plans post and move on, with ``cost.overlap``
setting how much of each transfer hides.

The trace has compute spans, blocked send/recv spans (zero-length recv spans where an async receive was
posted), a ``transfer`` span on both ends of every transfer, ``wait`` spans where a request's first
compute was held until its arrival or admission, and idle spans where a rank had finished before the
makespan. Its time origin is the stream start (time 0, from which ``Request.arrival`` counts), and its
meta lists the requests' arrivals (``[[id, arrival], ...]``) for :func:`.summary.summarize`.
"""

from __future__ import annotations

from .cost import Cost, piece_times
from .engine import Engine
from .ir import Plan
from .trace import Span, Trace
from .verify import verify


def simulate_plan(plan: Plan, cost: Cost, *, check: bool = True) -> Trace:
    """Simulated timeline of ``plan`` under ``cost`` (verifies the plan first unless ``check=False``)."""
    if check:
        verify(plan)
    requests = {q.id: q for q in plan.requests}
    shared: dict = {}          # (stage, lead) -> the step's pieces and their times

    def compute_time(stage: int, request: int, chunk: int) -> float:
        q = requests[request]
        pieces = plan.step_pieces(*plan.lead(request, chunk)) if plan.steps else ()
        if len(pieces) < 2:
            return float(cost.compute(stage, q.tokens(chunk), q.offset(chunk)))
        if (stage, pieces[0]) not in shared:
            shapes = [(requests[r].tokens(c), requests[r].offset(c)) for r, c in pieces]
            shared[(stage, pieces[0])] = dict(zip(pieces, piece_times(cost, stage, shapes)))
        return shared[(stage, pieces[0])][(request, chunk)]

    engine = Engine(plan, plan.comm, compute_time=compute_time, transfer_time=lambda n: float(cost.transfer(n)),
                    overlap=float(getattr(cost, "overlap", 1.0)), record=True).run()
    spans = list(engine.spans)
    for (stage, request, chunk), t in engine.transfers.items():
        for rank, peer in ((t.src, t.dst), (t.dst, t.src)):
            spans.append(Span(rank, "transfer", t.start, t.end, stage, request, chunk, peer))
    end = max((s.end for s in spans), default=0.0)
    for r, clock in enumerate(engine.clock):
        if clock < end:
            spans.append(Span(r, "idle", clock, end))
    meta = {"source": "simulated", "plan": plan.name, "comm": plan.comm, "layout": plan.layout.describe(),
            "requests": [list(q.chunk_sizes) for q in plan.requests], "cost": repr(cost),
            "arrivals": [[q.id, q.arrival] for q in plan.requests]}
    if plan.concurrency is not None:
        meta["concurrency"] = plan.concurrency
    return Trace(plan.num_ranks, tuple(spans), meta)


__all__ = ["simulate_plan"]
