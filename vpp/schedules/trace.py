"""Traces: one format for simulated and executed runs.

A trace is a list of per-rank spans (times in seconds, any common origin):

* ``compute``  -- the rank ran stage ``stage`` on (``request``, ``chunk``).
* ``send`` / ``recv`` -- the rank was blocked in a transfer of the activation (stage, request, chunk)
  to / from ``peer``: a blocking call, the non-overlappable part of a non-blocking send, or a compute
  waiting for its non-blocking receive. A zero-length span marks when a non-blocking op was posted.
* ``idle``     -- optional, informational: the rank had nothing to do.
* ``wait``     -- optional, informational: the rank held the first compute of request ``request`` until
  the request arrived or was admitted (see :mod:`.ir`).
* ``transfer`` -- optional: the activation was in flight between the rank and ``peer`` (recorded on both
  ends; does not occupy the rank). Used for the total communication time and the overlap ratio.

The summariser (:mod:`.summary`) does not trust ``idle`` or ``wait`` spans: it counts everything that is neither
compute nor exposed communication as bubble, and splits blocked spans between bubble (waiting for the
peer to post the matching operation) and exposed communication, so an executor can just record
"waited in recv from t0 to t1".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from vpp.safe_write import write_text

from .plot import plot_trace
from .spans import KINDS, Span
from .summary import Summary, summarize

__all__ = ["KINDS", "Span", "Trace"]

@dataclass(frozen=True)
class Trace:
    num_ranks: int
    spans: tuple[Span, ...]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spans", tuple(self.spans))
        bad = [s for s in self.spans if not 0 <= s.rank < self.num_ranks]
        if bad:
            raise ValueError(f"span on rank {bad[0].rank} in a trace of {self.num_ranks} ranks")

    @property
    def start(self) -> float:
        return min((s.start for s in self.spans), default=0.0)

    @property
    def end(self) -> float:
        return max((s.end for s in self.spans), default=0.0)

    @property
    def makespan(self) -> float:
        return self.end - self.start

    def of(self, rank: int | None = None, kind: str | None = None) -> list[Span]:
        """Spans of a rank and/or kind, in start order."""
        return sorted((s for s in self.spans if (rank is None or s.rank == rank) and (kind is None or s.kind == kind)),
                      key=lambda s: (s.start, s.end))

    def summarize(self) -> Summary:
        return summarize(self)

    def to_dict(self) -> dict:
        return {"num_ranks": self.num_ranks, "meta": self.meta, "spans": [s.to_dict() for s in self.spans]}

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        return cls(d["num_ranks"], tuple(Span(**s) for s in d["spans"]), dict(d.get("meta", {})))

    def save(self, path) -> None:
        """Write the trace as JSON (a new or regular file, replaced whole: :mod:`vpp.safe_write`)."""
        write_text(path, json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path) -> "Trace":
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def to_chrome(self, path=None) -> dict:
        """Chrome trace JSON (opens in Perfetto / chrome://tracing): one track per rank, transfers on a
        second process. Writes ``path`` if given; returns the dict."""
        t0, events = self.start, []
        for r in range(self.num_ranks):
            for pid, name in ((0, f"rank {r}"), (1, f"rank {r} transfers")):
                events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": r, "args": {"name": name}})
        events.append({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "ranks"}})
        events.append({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "transfers in flight"}})
        for s in self.spans:
            if s.duration <= 0:
                continue
            args = {k: v for k, v in s.to_dict().items() if k not in ("rank", "kind", "start", "end")}
            name = s.kind if s.stage is None else f"{s.kind} {s.label}"
            events.append({"name": name, "cat": s.kind, "ph": "X", "pid": 1 if s.kind == "transfer" else 0,
                           "tid": s.rank, "ts": (s.start - t0) * 1e6, "dur": s.duration * 1e6, "args": args})
        out = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {k: str(v) for k, v in self.meta.items()}}
        if path is not None:
            write_text(path, json.dumps(out))
        return out

    def plot(self, path, **kw) -> None:
        """PNG timeline like the paper's Figure 2 (needs matplotlib, the "plot" extra)."""
        plot_trace(self, path, **kw)
