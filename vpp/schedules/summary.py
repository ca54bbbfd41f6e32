"""Table 2 of the paper from a trace: computation, bubble (idle), exposed communication, overlap ratio.

Attribution. Per rank, over the trace's makespan (first span start to last span end):

* compute       -- the sum of ``compute`` spans;
* exposed comm  -- the part of each blocked ``send``/``recv`` span after the peer posted the matching
  operation (the peer's earliest ``recv``/``send`` span of the same (stage, request, chunk)); the part
  before counts as bubble, since the rank was really waiting for the peer's work. Without a matching
  span the whole span is exposed. Clock skew between ranks is clamped (negative gaps count as 0);
* waiting       -- with arrival times (``arrivals``, or the trace's ``meta["arrivals"]`` as the simulator
  writes it): idle time while the system held no request, i.e. outside the union over requests of
  [arrival, end of the request's last compute]. A stream that runs dry is waiting for work, not
  suffering a bubble of the schedule. Idle while some arrived request is unfinished stays bubble (e.g.
  a drain that a later request arrived too late to fill);
* bubble        -- everything else: makespan - compute - exposed comm - waiting (never below 0);
* comm          -- the total time of the transfers the rank took part in (``transfer`` spans; without
  them, its exposed comm).

The headline numbers are sums over ranks; ``mean()`` gives per-rank means, for which
compute + bubble + exposed comm + waiting = makespan, the shape of the paper's Table 2. bubble ratio =
bubble / (P x makespan - waiting), the bubble share of the time the pipeline had work (bubble /
(P x makespan) when nothing waited); overlap ratio = 1 - exposed comm / comm (0 when nothing was
communicated).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .spans import Span


@dataclass(frozen=True)
class Summary:
    num_ranks: int
    makespan: float
    compute_per_rank: tuple[float, ...]
    bubble_per_rank: tuple[float, ...]
    exposed_per_rank: tuple[float, ...]
    comm_per_rank: tuple[float, ...]
    waiting_per_rank: tuple[float, ...] = ()

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
    def waiting(self) -> float:
        return sum(self.waiting_per_rank)

    @property
    def overlap_ratio(self) -> float:
        return min(1.0, max(0.0, 1.0 - self.exposed_comm / self.comm)) if self.comm > 0 else 0.0

    @property
    def bubble_ratio(self) -> float:
        busy = self.num_ranks * self.makespan - self.waiting
        return self.bubble / busy if busy > 0 else 0.0

    def mean(self, name: str) -> float:
        """Per-rank mean of "compute", "bubble", "exposed_comm", "comm" or "waiting"."""
        return getattr(self, name) / self.num_ranks

    def to_dict(self) -> dict:
        return {"num_ranks": self.num_ranks, "makespan": self.makespan,
                "compute": self.compute, "bubble": self.bubble, "exposed_comm": self.exposed_comm,
                "comm": self.comm, "waiting": self.waiting, "overlap_ratio": self.overlap_ratio,
                "bubble_ratio": self.bubble_ratio,
                "compute_per_rank": list(self.compute_per_rank), "bubble_per_rank": list(self.bubble_per_rank),
                "exposed_per_rank": list(self.exposed_per_rank), "comm_per_rank": list(self.comm_per_rank),
                "waiting_per_rank": list(self.waiting_per_rank)}

    def format(self, name: str = "plan") -> str:
        return format_summaries({name: self})


def _partner_starts(trace: "Trace") -> dict:
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


def trace_arrivals(trace: "Trace", arrivals=None) -> dict[int, float] | None:
    """Request id -> arrival: ``arrivals`` (a mapping or [[id, arrival], ...]) or the trace's meta."""
    arrivals = trace.meta.get("arrivals") if arrivals is None else arrivals
    if arrivals is None:
        return None
    items = arrivals.items() if isinstance(arrivals, dict) else arrivals
    return {int(q): float(a) for q, a in items}


def empty_intervals(trace: "Trace", arrivals=None) -> list[tuple[float, float]]:
    """The intervals of the trace's span during which no arrived request was unfinished (a request is in
    the system from its arrival to the end of its last compute span); [] without arrival times."""
    arrivals = trace_arrivals(trace, arrivals)
    if not arrivals:
        return []
    done: dict[int, float] = {}
    for s in trace.spans:
        if s.kind == "compute" and s.request is not None:
            done[s.request] = max(done.get(s.request, s.end), s.end)
    busy = sorted((a, done[q]) for q, a in arrivals.items() if q in done and done[q] > a)
    out, now = [], trace.start
    for a, b in busy:
        if a > now:
            out.append((now, a))
        now = max(now, b)
    if now < trace.end:
        out.append((now, trace.end))
    return out


def _split_waiting(segs: list, empty: list[tuple[float, float]]) -> list:
    """Bubble segments cut where they overlap ``empty`` intervals; those parts become "wait"."""
    if not empty:
        return segs
    out = []
    for kind, a, b, span in segs:
        if kind != "bubble":
            out.append((kind, a, b, span))
            continue
        now = a
        for e0, e1 in empty:
            lo, hi = max(a, e0), min(b, e1)
            if lo >= hi:
                continue
            if lo > now:
                out.append(("bubble", now, lo, span))
            out.append(("wait", lo, hi, span))
            now = hi
        if now < b:
            out.append(("bubble", now, b, span))
    return out


def timeline(trace: "Trace", arrivals=None) -> list[list[tuple[str, float, float, Span | None]]]:
    """Per rank, the attributed segments (kind, start, end, span) over the makespan, kind in "compute",
    "comm" (exposed), "bubble" (blocked waiting for the peer, or nothing to do) and, with arrival times,
    "wait" (nothing to do because no request was in the system); for plots."""
    empty = empty_intervals(trace, arrivals)
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
        out.append(_split_waiting(filled, empty))
    return out


def summarize(trace: "Trace", arrivals=None) -> Summary:
    """Table 2 numbers of ``trace`` (see the module docstring); ``arrivals`` overrides the trace's meta."""
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
    waiting = [0.0] * trace.num_ranks
    if empty_intervals(trace, arrivals):
        for r, segs in enumerate(timeline(trace, arrivals)):
            waiting[r] = sum(b - a for kind, a, b, _ in segs if kind == "wait")
    bubble = [max(0.0, makespan - c - e - w) for c, e, w in zip(compute, exposed, waiting)]
    return Summary(trace.num_ranks, makespan, tuple(compute), tuple(bubble), tuple(exposed), tuple(comm),
                   tuple(waiting))


ROWS = (("Computation", lambda s: s.mean("compute")), ("Bubble", lambda s: s.mean("bubble")),
        ("Exposed comm.", lambda s: s.mean("exposed_comm")), ("Makespan", lambda s: s.makespan))


def format_summaries(summaries: dict[str, Summary], *, unit: str = "s") -> str:
    """Plans side by side in the shape of the paper's Table 2 (times are means per rank)."""
    names = list(summaries)
    width = max([12] + [len(n) + 2 for n in names])
    lines = [f"{'per rank (' + unit + ')':<18}" + "".join(f"{n:>{width}}" for n in names)]
    rows = ROWS if not any(s.waiting > 0 for s in summaries.values()) else \
        ROWS[:3] + (("Waiting", lambda s: s.mean("waiting")),) + ROWS[3:]
    for label, get in rows:
        lines.append(f"{label:<18}" + "".join(f"{get(summaries[n]):>{width}.4g}" for n in names))
    for label, attr in (("Overlap ratio", "overlap_ratio"), ("Bubble ratio", "bubble_ratio")):
        lines.append(f"{label:<18}" + "".join(f"{100 * getattr(summaries[n], attr):>{width - 1}.2f}%" for n in names))
    return "\n".join(lines)


def summaries_json(summaries: dict[str, Summary], **extra) -> str:
    return json.dumps({"plans": {n: s.to_dict() for n, s in summaries.items()}, **extra}, indent=2)


__all__ = [
    "ROWS", "Summary", "empty_intervals", "format_summaries", "split_blocked", "summaries_json", "summarize",
    "timeline", "trace_arrivals",
]
