"""Table 2 of the paper from a trace: computation, bubble (idle), exposed communication, overlap ratio.

Attribution. Per rank, over the trace's makespan (first span start to last span end):

* compute       -- the sum of ``compute`` spans;
* exposed comm  -- the part of each blocked ``send``/``recv`` span after the peer posted the matching
  operation (the peer's earliest ``recv``/``send`` span of the same (stage, request, chunk)); the part
  before counts as bubble, since the rank was really waiting for the peer's work. Without a matching
  span the whole span is exposed. Clock skew between ranks is clamped (negative gaps count as 0);
* bubble        -- everything else: makespan - compute - exposed comm (never below 0);
* comm          -- the total time of the transfers the rank took part in (``transfer`` spans; without
  them, its exposed comm).

The headline numbers are sums over ranks; ``mean()`` gives per-rank means, for which
compute + bubble + exposed comm = makespan, the shape of the paper's Table 2. bubble ratio =
bubble / (P x makespan); overlap ratio = 1 - exposed comm / comm (0 when nothing was communicated).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .trace import Span, Trace


@dataclass(frozen=True)
class Summary:
    num_ranks: int
    makespan: float
    compute_per_rank: tuple[float, ...]
    bubble_per_rank: tuple[float, ...]
    exposed_per_rank: tuple[float, ...]
    comm_per_rank: tuple[float, ...]

    @property
    def compute(self) -> float:
        return sum(self.compute_per_rank)

    @property
    def bubble(self) -> float:
        return sum(self.bubble_per_rank)

    @property
    def exposed_comm(self) -> float:
        return sum(self.exposed_per_rank)

    @property
    def comm(self) -> float:
        return sum(self.comm_per_rank)

    @property
    def overlap_ratio(self) -> float:
        return min(1.0, max(0.0, 1.0 - self.exposed_comm / self.comm)) if self.comm > 0 else 0.0

    @property
    def bubble_ratio(self) -> float:
        return self.bubble / (self.num_ranks * self.makespan) if self.makespan > 0 else 0.0

    def mean(self, name: str) -> float:
        """Per-rank mean of "compute", "bubble", "exposed_comm" or "comm"."""
        return getattr(self, name) / self.num_ranks

    def to_dict(self) -> dict:
        return {"num_ranks": self.num_ranks, "makespan": self.makespan,
                "compute": self.compute, "bubble": self.bubble, "exposed_comm": self.exposed_comm,
                "comm": self.comm, "overlap_ratio": self.overlap_ratio, "bubble_ratio": self.bubble_ratio,
                "compute_per_rank": list(self.compute_per_rank), "bubble_per_rank": list(self.bubble_per_rank),
                "exposed_per_rank": list(self.exposed_per_rank), "comm_per_rank": list(self.comm_per_rank)}

    def format(self, name: str = "plan") -> str:
        return format_summaries({name: self})


def _partner_starts(trace: Trace) -> dict:
    """(kind, stage, request, chunk, rank) -> earliest start of such a span."""
    first: dict = {}
    for s in trace.spans:
        if s.kind in ("send", "recv") and s.stage is not None:
            k = (s.kind, s.stage, s.request, s.chunk, s.rank)
            first[k] = min(first.get(k, s.start), s.start)
    return first


def split_blocked(span: Span, partners: dict) -> tuple[float, float]:
    """(bubble, exposed) parts of a blocked send/recv span."""
    other = "recv" if span.kind == "send" else "send"
    if span.stage is None or span.peer is None or (other, *span.key, span.peer) not in partners:
        return 0.0, span.duration
    wait = min(max(partners[(other, *span.key, span.peer)] - span.start, 0.0), span.duration)
    return wait, span.duration - wait


def timeline(trace: Trace) -> list[list[tuple[str, float, float, Span | None]]]:
    """Per rank, the attributed segments (kind, start, end, span) over the makespan, kind in "compute",
    "comm" (exposed), "bubble" (blocked waiting for the peer, or nothing to do); for plots."""
    partners = _partner_starts(trace)
    t0, t1 = trace.start, trace.end
    out = []
    for r in range(trace.num_ranks):
        segs = []
        for s in trace.of(r):
            if s.kind == "compute" and s.duration > 0:
                segs.append(("compute", s.start, s.end, s))
            elif s.kind in ("send", "recv") and s.duration > 0:
                wait, _ = split_blocked(s, partners)
                if wait > 0:
                    segs.append(("bubble", s.start, s.start + wait, s))
                if s.duration > wait:
                    segs.append(("comm", s.start + wait, s.end, s))
        segs.sort(key=lambda x: x[1])
        filled, now = [], t0
        for seg in segs:
            if seg[1] > now:
                filled.append(("bubble", now, seg[1], None))
            filled.append(seg)
            now = max(now, seg[2])
        if now < t1:
            filled.append(("bubble", now, t1, None))
        out.append(filled)
    return out


def summarize(trace: Trace) -> Summary:
    makespan = trace.makespan
    partners = _partner_starts(trace)
    compute = [0.0] * trace.num_ranks
    exposed = [0.0] * trace.num_ranks
    comm = [0.0] * trace.num_ranks
    has_transfers = any(s.kind == "transfer" for s in trace.spans)
    for s in trace.spans:
        if s.kind == "compute":
            compute[s.rank] += s.duration
        elif s.kind in ("send", "recv"):
            exposed[s.rank] += split_blocked(s, partners)[1]
        elif s.kind == "transfer":
            comm[s.rank] += s.duration
    if not has_transfers:
        comm = list(exposed)
    bubble = [max(0.0, makespan - c - e) for c, e in zip(compute, exposed)]
    return Summary(trace.num_ranks, makespan, tuple(compute), tuple(bubble), tuple(exposed), tuple(comm))


ROWS = (("Computation", lambda s: s.mean("compute")), ("Bubble", lambda s: s.mean("bubble")),
        ("Exposed comm.", lambda s: s.mean("exposed_comm")), ("Makespan", lambda s: s.makespan))


def format_summaries(summaries: dict[str, Summary], *, unit: str = "s") -> str:
    """Plans side by side in the shape of the paper's Table 2 (times are means per rank)."""
    names = list(summaries)
    width = max([12] + [len(n) + 2 for n in names])
    lines = [f"{'per rank (' + unit + ')':<18}" + "".join(f"{n:>{width}}" for n in names)]
    for label, get in ROWS:
        lines.append(f"{label:<18}" + "".join(f"{get(summaries[n]):>{width}.4g}" for n in names))
    for label, attr in (("Overlap ratio", "overlap_ratio"), ("Bubble ratio", "bubble_ratio")):
        lines.append(f"{label:<18}" + "".join(f"{100 * getattr(summaries[n], attr):>{width - 1}.2f}%" for n in names))
    return "\n".join(lines)


def summaries_json(summaries: dict[str, Summary], **extra) -> str:
    return json.dumps({"plans": {n: s.to_dict() for n, s in summaries.items()}, **extra}, indent=2)
