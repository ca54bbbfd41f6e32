"""The paper's request streams at paper scale: each strategy through its plan builder (packing included)
with the deployment cost model of :mod:`vpp.perf`, simulated.

For one deployment (:class:`vpp.perf.runs.Setup`) and one :class:`vpp.schedules.workloads.Workload` (the
paper's short, long or mixed stream, unscaled), :func:`serve` runs a strategy at a chunk budget:

* CPP -- a loop layout, fixed chunks, requests pipelined back to back (:func:`vpp.schedules.build_cpp`);
* DCPP -- the same with vLLM-Ascend's planner (one planner for the stream, with its online calibration
  and the device synchronisation it implies, as :mod:`vpp.perf.runs` describes);
* VPP-Async -- the V, one request after another; VPP-Async + packing -- the dual-queue scheduler of
  :func:`vpp.schedules.build_vpp_packed`, planned with the same cost model (the paper's full method).

Every plan carries the workload's concurrency limit; TTFT is measured from the moment the client hands a
request over (:mod:`vpp.schedules.stream`). :func:`best_budget` keeps, per strategy, the budget with the
highest throughput (the paper's rule: each strategy at its best budget).

With ``setup.shared_budget`` (:class:`vpp.perf.runs.Setup`) every strategy fills its steps as vLLM's
scheduler does (:mod:`vpp.schedules.shared_budget`): a step carries the rest of the running request, then
the first chunks of the next ones, up to the budget; DCPP shares vLLM-Ascend's time budget the same way
and calibrates online on each step's time. A step is one pipeline step (:mod:`vpp.schedules.steps`): one
hand-over for the step; its pieces run back to back on each stage, each its own call with one per-step
overhead for the step, or with ``setup.batched_steps`` as one forward (:mod:`vpp.perf.batched`: GEMMs,
MoE, norms and TP collectives once on the step's tokens, attention per piece), so short prompts share
a step's fixed costs. ``setup.packing_estimate``
says what VPP + packing estimates its drain windows with: this deployment's cost model (``"cost"``,
default) or Algorithm 2's own law, tau_k = (k + 1) t (``"eq2"``, :func:`vpp.schedules.packing.default_cost`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from vpp.perf.runs import Setup, dcpp_chunking
from vpp.schedules import simulate, strategies
from vpp.schedules.stream import StreamStats
from vpp.schedules.workloads import Workload

from .published import CHUNKS

STREAM_STRATEGIES = ("cpp", "dcpp", "vpp-async", "vpp-packed")


@dataclass
class Served:
    strategy: str
    chunk: int
    stats: StreamStats
    chunks: int

    def to_dict(self) -> dict:
        d = self.stats.to_dict()
        d.pop("ttft")
        return {"strategy": self.strategy, "chunk": self.chunk, "chunks": self.chunks, **d}


def serve(setup: Setup, workload: Workload, strategy: str, chunk: int, *, per_rank: bool = False) -> Served:
    """Simulate ``workload`` under ``strategy`` with chunk budget ``chunk`` on ``setup``; ``per_rank``
    cuts the layers balanced per rank (:meth:`vpp.perf.runs.Setup.balanced_layout`, costs of a budget
    chunk at the middle of the median prompt) instead of evenly."""
    spec = strategies.get(strategy, strategies.PLANNED)
    if per_rank:
        mid = sorted(workload.lengths)[len(workload.lengths) // 2] // 2
        layout = setup.balanced_layout(spec.layout, min(chunk, 2 * mid or chunk), mid)
    else:
        layout = setup.layout(spec.layout)
    cost = setup.cost(layout, strategy)
    requests = steps = None  # DCPP: cut by one online planner for the stream (vpp.perf.runs.dcpp_chunking)
    if spec.chunking == "dcpp":
        requests, steps = dcpp_chunking(setup, workload.lengths, chunk, cost, layout, workload.arrivals,
                                        concurrency=workload.concurrency, with_steps=True)
    estimate = None if spec.packs and setup.packing_estimate == "eq2" else cost   # None: Algorithm 2's Eq. 2 law
    sim = simulate(strategy, layout, workload, cost, chunk_size=chunk, shared_budget=setup.shared_budget,
                   requests=requests, steps=steps, estimate=estimate)
    return Served(strategy, chunk, sim.stats, sim.chunks)


def best_budget(setup: Setup, workload: Workload, strategy: str, chunks: Sequence[int] = CHUNKS, *,
                per_rank: bool = False) -> Served:
    """The budget with the highest throughput for this strategy (ties: the lower median TTFT)."""
    runs = [serve(setup, workload, strategy, c, per_rank=per_rank) for c in chunks]
    return max(runs, key=lambda r: (r.stats.throughput, -r.stats.ttft_median))


def compare(setup: Setup, workload: Workload, strategies_: Sequence[str] = STREAM_STRATEGIES,
            chunks: Sequence[int] = CHUNKS, *, per_rank: bool = False) -> dict[str, Served]:
    return {s: best_budget(setup, workload, s, chunks, per_rank=per_rank) for s in strategies_}


def gain(rows: dict[str, Served], over: str, of: str = "vpp-packed") -> float:
    """Throughput gain of ``of`` over ``over`` (a fraction)."""
    return rows[of].stats.throughput / rows[over].stats.throughput - 1.0


__all__ = ["STREAM_STRATEGIES", "Served", "best_budget", "compare", "gain", "serve"]
