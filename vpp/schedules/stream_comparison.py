"""A simulated comparison of CPP, DCPP, VPP, VPP-Async and VPP-Async + packing on one request stream
(the engine of ``vpp serve-sim``; each strategy through the one runner, :func:`vpp.schedules.runner.simulate`).

Every strategy runs the same model (``layers`` layers) on ``pp`` ranks under one cost model:

* CPP, DCPP        -- a loop layout (one stage per rank), requests pipelined back to back
  (:func:`vpp.schedules.builders.build_cpp`), blocking transfers. CPP cuts prompts into ``chunk_size`` chunks;
  DCPP's planner (:mod:`vpp.schedules.dcpp`, ``dcpp_variant``) uses ``chunk_size`` as its budget and is profiled on
  the cost model (``stage_measure`` over the stages its variant profiles).
* VPP, VPP-Async   -- a V (``2 folds pp`` stages), fixed chunks, one request at a time (the default
  ``request_order="sequential"``); blocking / non-blocking transfers.
* VPP-Async + packing -- the same V with :func:`vpp.schedules.packing.build_vpp_packed`, whose estimates use the same
  cost model.

All plans carry the workload's concurrency limit and arrival times. The default cost model,
:func:`machine_cost`, is the development machine's per-layer attention law (measured there: one layer
of 8 heads x 64 at 16K tokens in 1K chunks, tau_k ~ 89 + 34 k ms, R^2 0.99; gloo ~3 GB/s).

Three more strategies (:data:`EXTRA`) put the five in context:

* ``cpp-async``, ``dcpp-async`` -- the loop with non-blocking transfers. Rank 0 may then run any number
  of chunks ahead of rank 1 (unbounded activation buffering): an upper bound for CPP while a transfer
  takes less than tau grows per chunk (each receive is posted after the previous compute). Blocking CPP keeps
  about P chunks in flight, like the batch queues of vLLM's and SGLang's pipelines.
* ``vpp-async-pipelined`` -- VPP-Async with ``request_order="pipelined"``: the unit-time slot order
  numbers the chunks of all requests consecutively, which overlaps requests without any cost model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from vpp.schedules import strategies
from vpp.schedules.cost import LinearCost, seconds_per_token
from vpp.schedules.dcpp import DcppPlanner, profiled_stages, stage_measure
from vpp.schedules.layout import Layout, make_layout
from vpp.schedules.runner import Simulated, simulate
from vpp.schedules.workloads import Workload

EXTRA = tuple(n for n, s in strategies.STRATEGIES.items() if s.variant)


def machine_cost(layout: Layout, *, chunk: int = 1024, first: float = 0.089, growth: float = 0.034,
                 overhead: float = 0.002, hidden: int = 512, bytes_per_value: int = 4, bandwidth: float = 3e9,
                 latency: float = 1e-4, overlap: float = 0.5) -> LinearCost:
    """Per layer, this machine's law (measured on the development machine: one layer of 8 heads x 64 at 16K tokens in 1K chunks,
    tau_k ~ 89 + 34 k ms): attention ``growth / chunk^2`` s per token pair (half of it within the
    chunk), ``overhead`` s per chunk (launches, dispatch: an assumption), the rest per token so that a
    first chunk of ``chunk`` tokens takes ``first``; fp32 activations of width ``hidden`` over gloo at
    ``bandwidth`` bytes/s plus ``latency``; ``overlap`` of an async transfer hides (little on 2 cores).
    Stage costs scale with their layer counts."""
    beta = growth / chunk ** 2
    alpha = (first - overhead - beta * chunk * chunk / 2) / chunk
    if alpha < 0:
        raise ValueError(f"first={first} s is less than the overhead and in-chunk attention of a {chunk}-token chunk")
    return LinearCost(per_chunk=overhead, per_token=alpha, per_token_prefix=beta, per_token_sq=beta / 2,
                      latency=latency, overlap=overlap,
                      seconds_per_token=seconds_per_token(hidden, bytes_per_value=bytes_per_value, bandwidth=bandwidth),
                      stage_weights=tuple(float(n) for n in layout.partition))


@dataclass
class StreamSetup:
    """The deployment all strategies share (see the module docstring)."""

    pp: int = 2
    layers: int = 8
    folds: int = 1
    chunk_size: int = 1024
    dcpp_variant: str = "vllm-ascend"
    dcpp_min_chunk: int | None = None   # None: the mode's own (vLLM-Ascend 4096, clamped to the budget)
    shared_budget: bool = False         # one token budget per step shared by the requests (shared_budget.py)
    cost: Callable[[Layout], object] = machine_cost

    def layout(self, strategy: str) -> Layout:
        if strategies.get(strategy).layout == "loop":
            return make_layout("loop", self.layers, self.pp)
        return make_layout("v", self.layers, self.pp, folds=self.folds)


def run_strategy(setup: StreamSetup, workload: Workload, strategy: str, *, check: bool = True) -> Simulated:
    """``strategy`` on ``workload`` in ``setup``'s deployment (:func:`vpp.schedules.runner.simulate`):
    its layout kind, ``setup.cost`` on it and, for DCPP, a planner profiled on that cost."""
    spec = strategies.get(strategy, strategies.PLANNED + EXTRA)
    layout = setup.layout(strategy)
    cost = setup.cost(layout)
    planner = None
    if spec.chunking == "dcpp":
        planner = DcppPlanner(setup.dcpp_variant, budget=setup.chunk_size, min_chunk=setup.dcpp_min_chunk)
        planner.profile(stage_measure(cost, profiled_stages(layout, setup.dcpp_variant)))
    return simulate(strategy, layout, workload, cost, chunk_size=setup.chunk_size, planner=planner,
                    shared_budget=setup.shared_budget, check=check)


def compare(setup: StreamSetup, workload: Workload, names: Sequence[str] = strategies.PLANNED, *,
            check: bool = True) -> dict[str, Simulated]:
    return {s: run_strategy(setup, workload, s, check=check) for s in names}


def packing_effect(rows: dict[str, Simulated]) -> dict:
    """What packing removes relative to VPP-Async: drain-window idle (the metric of :mod:`vpp.schedules.stream`),
    all bubble, and makespan; fractions are of VPP-Async's."""
    a, p = rows["vpp-async"], rows["vpp-packed"]
    frac = lambda before, after: (before - after) / before if before > 0 else 0.0
    return {"drain_idle_async": a.drain_idle, "drain_idle_packed": p.drain_idle,
            "drain_idle_removed": frac(a.drain_idle, p.drain_idle),
            "bubble_async": a.summary.bubble, "bubble_packed": p.summary.bubble,
            "bubble_removed": frac(a.summary.bubble, p.summary.bubble),
            "makespan_saved": frac(a.stats.makespan, p.stats.makespan),
            "packed_chunks": sum(p.packed.values())}


def format_table(rows: dict[str, Simulated]) -> str:
    """A markdown table, one strategy per row; times in seconds of the cost model."""
    head = ("| Strategy | chunks | makespan (s) | TTFT median (s) | TTFT p90 (s) | throughput (tok/s) | "
            "bubble ratio | exposed comm (s/rank) | drain idle (s, all ranks) |")
    lines = [head, "|" + "---|" * 9]
    for name, r in rows.items():
        lines.append(f"| {strategies.get(name).label} | {r.chunks} | {r.stats.makespan:.2f} | {r.stats.ttft_median:.2f} | "
                     f"{r.stats.ttft_p90:.2f} | {r.stats.throughput:.0f} | {100 * r.summary.bubble_ratio:.1f}% | "
                     f"{r.summary.mean('exposed_comm'):.3f} | {r.drain_idle:.2f} |")
    return "\n".join(lines)


def format_effect(rows: dict[str, Simulated]) -> str:
    if "vpp-async" not in rows or "vpp-packed" not in rows:
        return ""
    e = packing_effect(rows)
    return (f"Packing vs VPP-Async: {e['packed_chunks']} chunks packed; drain-window idle "
            f"{e['drain_idle_async']:.2f} s -> {e['drain_idle_packed']:.2f} s ({100 * e['drain_idle_removed']:.1f}% "
            f"removed); all bubble {e['bubble_async']:.2f} s -> {e['bubble_packed']:.2f} s "
            f"({100 * e['bubble_removed']:.1f}% removed); makespan {100 * e['makespan_saved']:.1f}% shorter.")


__all__ = ["EXTRA", "StreamSetup", "compare", "format_effect", "format_table", "machine_cost", "packing_effect",
           "run_strategy"]
