"""The one runner: simulate a strategy on a workload under a cost model.

``simulate(strategy, layout, workload, cost)`` is the single place where "run strategy X on workload W
under cost C" is written; every command and benchmark that simulates calls it (``vpp simulate``,
``vpp serve-sim`` and the stream comparison of :mod:`.stream_comparison`, the paper-scale runs of
:func:`vpp.perf.runs.run` and the tuner, the paper's streams; the replay of a measured run,
:func:`vpp.cli.prefill_rounds.replay`, simulates the executed plan itself). Each step is data from one table:

1. the workload is cut into chunked requests: fixed ``chunk_size`` chunks, or a DCPP ``planner``'s
   (:class:`.dcpp.DcppPlanner`), each under one token budget per step shared by the requests when
   ``shared_budget`` (:mod:`.shared_budget`); a caller whose chunking observes the cost as it goes (the
   online DCPP of :mod:`vpp.perf.runs`) passes the ``requests`` (and shared ``steps``) it already has;
2. the strategy's builder (:data:`.strategies.STRATEGIES`) emits the plan on ``layout`` with the
   workload's concurrency limit and arrivals; ``estimate`` is what packing plans its drain windows with
   (the cost itself by default; None: Algorithm 2's own law);
3. :func:`.simulator.simulate_plan` interprets the plan under ``cost``.

A strategy runs on the layout it is given: VPP's order on a loop or CPP's on a V is a simulation
question the runner answers (the runtime, whose stage modules fix the layout, refuses a V strategy on a
loop). Pure Python, like the rest of :mod:`vpp.schedules`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from . import strategies
from .dcpp import DcppPlanner
from .ir import Plan, Request
from .layout import Layout
from .packing import packed_chunks
from .shared_budget import shared_budget_stream
from .simulator import simulate_plan
from .stream import StreamStats, drain_idle, stream_stats
from .summary import Summary, summarize
from .trace import Trace
from .workloads import Workload

_SAME = object()  # estimate: the simulated cost itself


@dataclass
class Simulated:
    """One strategy simulated on one workload: its plan, trace and cost, with the Table 2 summary, the
    stream statistics, the drain-window idle and the packed chunks computed on first use."""

    strategy: str
    plan: Plan
    trace: Trace
    cost: object
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def _once(self, key: str, compute):
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    @property
    def summary(self) -> Summary:
        return self._once("summary", lambda: summarize(self.trace))

    @property
    def stats(self) -> StreamStats:
        return self._once("stats", lambda: stream_stats(self.trace, self.plan))

    @property
    def drain_idle(self) -> float:
        return self._once("drain_idle", lambda: drain_idle(self.trace, self.plan))

    @property
    def packed(self) -> dict:
        """Chunks packed into another request's drain, by request (empty unless the strategy packs)."""
        return self._once("packed", lambda: packed_chunks(self.plan) if strategies.get(self.strategy).packs else {})

    @property
    def requests(self) -> tuple[Request, ...]:
        return self.plan.requests

    @property
    def chunks(self) -> int:
        return sum(q.num_chunks for q in self.plan.requests)

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "chunks": self.chunks, "drain_idle": self.drain_idle,
                "packed_chunks": sum(self.packed.values()), **self.stats.to_dict(),
                "summary": self.summary.to_dict()}


def as_workload(workload: Workload | Sequence[int] | int) -> Workload:
    """``workload`` itself, or prompts of the given length(s), all there at time 0, no concurrency limit."""
    if isinstance(workload, Workload):
        return workload
    lengths = [workload] if isinstance(workload, int) else list(workload)
    return Workload("prompts", tuple(lengths), (0.0,) * len(lengths), None)


def cut(workload: Workload, chunk_size: int, *, planner: DcppPlanner | None = None,
        shared_budget: bool = False) -> tuple[list[Request], list | None]:
    """The workload as chunked requests and, under a shared budget, the steps they share (else None):
    ``chunk_size`` chunks, or a DCPP ``planner``'s sizes within the ``chunk_size`` budget."""
    if shared_budget:
        return shared_budget_stream(workload.lengths, chunk_size, planner=planner, arrivals=workload.arrivals,
                                    concurrency=workload.concurrency)
    if planner is not None:
        return workload.requests(planner=planner), None
    return workload.requests(chunk_size), None


def simulate(strategy: str, layout: Layout, workload: Workload | Sequence[int] | int, cost, *,
             chunk_size: int | None = None, planner: DcppPlanner | None = None, shared_budget: bool = False,
             requests: Sequence[Request] | None = None, steps=None, estimate=_SAME,
             check: bool = False) -> Simulated:
    """Simulate ``strategy`` (a name of :data:`.strategies.STRATEGIES`) on ``layout`` for ``workload``
    (a :class:`.workloads.Workload`, or prompt lengths) under ``cost`` (see the module docstring):
    the workload is cut by :func:`cut` unless ``requests`` (and ``steps``) are given; ``check``
    verifies the plan before simulating it."""
    spec = strategies.get(strategy)
    if requests is None:
        if chunk_size is None:
            raise ValueError(f"simulate {strategy}: give chunk_size (the token budget) or the chunked requests")
        workload = as_workload(workload)
        requests, steps = cut(workload, chunk_size, planner=planner, shared_budget=shared_budget)
    concurrency = workload.concurrency if isinstance(workload, Workload) else None
    plan = spec.plan(layout, requests, concurrency=concurrency, cost=cost if estimate is _SAME else estimate,
                     steps=steps, any_layout=True)
    return Simulated(spec.name, plan, simulate_plan(plan, cost, check=check), cost)


__all__ = ["Simulated", "as_workload", "cut", "simulate"]
