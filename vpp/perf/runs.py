"""One simulated run of a strategy: layout + requests + plan builder + cost model -> paper-style row.

Strategies: ``cpp`` (loop layout, fixed chunks, blocking), ``dcpp`` (loop layout, chunks from a DCPP
planner profiled on the cost model, blocking), ``vpp`` (fold-back V, blocking, Algorithm 1),
``vpp-async`` (V, reordered, non-blocking) and ``vpp-async-packed`` (VPP-Async with the dual-queue
cross-request packing of :func:`vpp.schedules.build_vpp_packed`, planned with the same cost model). ``layout`` / ``folds`` /
``partition`` override the strategy's layout (e.g. an interleaved layout run with the VPP builders).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import vpp.schedules as sch
from vpp.schedules.dcpp import DcppPlanner, dcpp_requests, profiled_stages, stage_measure

from .arch import Arch
from .cost import DeploymentCost
from .decompose import Row, decompose
from .device import Device
from .ops import Parallel

STRATEGIES = ("cpp", "dcpp", "vpp", "vpp-async", "vpp-async-packed")


@dataclass
class Setup:
    """A deployment: architecture, device, per-stage parallelism and pipeline depth."""

    arch: Arch
    device: Device
    par: Parallel = field(default_factory=Parallel)
    pp: int = 2
    dcpp_variant: str = "vllm-ascend"
    dcpp_online: bool = False    # vLLM-Ascend's online re-fit from each chunk's (simulated) time

    def layout(self, kind: str, folds: int = 1, partition=None):
        return sch.make_layout(kind, self.arch.layers, self.pp, folds=folds, partition=partition)

    def cost(self, layout) -> DeploymentCost:
        return DeploymentCost(self.arch, self.device, layout, self.par)


@dataclass
class Run:
    row: Row
    plan: object
    trace: object
    cost: DeploymentCost
    requests: list


def requests_for(setup: Setup, strategy: str, lengths, chunk: int, cost: DeploymentCost, layout) -> list:
    if strategy == "dcpp":
        stages = profiled_stages(layout, setup.dcpp_variant)
        planner = DcppPlanner(setup.dcpp_variant, budget=chunk)
        planner.profile(stage_measure(cost, stages))
        if not setup.dcpp_online:
            return dcpp_requests(lengths, planner)
        out = []
        for i, n in enumerate(lengths):           # plan chunk by chunk, observing each one's time
            done, sizes = 0, []
            while done < n:
                c = planner.next_chunk(done, n - done)
                planner.observe(c, done, sum(cost.compute(s, c, done) for s in stages))
                sizes.append(c)
                done += c
            out.append(sch.Request(i, tuple(sizes)))
        return out
    return sch.chunk_requests(lengths, chunk)


def run(setup: Setup, strategy: str, lengths, chunk: int, *, kind: str | None = None, folds: int = 1,
        partition=None, requests=None, name: str | None = None) -> Run:
    """Simulate ``strategy`` on prompts of ``lengths`` with chunk budget ``chunk``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {STRATEGIES}")
    lengths = [int(n) for n in ([lengths] if isinstance(lengths, int) else lengths)]
    if kind is None:
        kind = "loop" if strategy in ("cpp", "dcpp") else "v"
    layout = setup.layout(kind, folds if kind != "loop" else 1, partition)
    cost = setup.cost(layout)
    reqs = requests if requests is not None else requests_for(setup, strategy, lengths, chunk, cost, layout)
    if strategy in ("cpp", "dcpp"):
        plan = sch.build_cpp(layout, reqs) if kind == "loop" else sch.build_vpp(layout, reqs)
    elif strategy == "vpp":
        plan = sch.build_vpp(layout, reqs)
    elif strategy == "vpp-async":
        plan = sch.build_vpp_async(layout, reqs)
    else:
        plan = sch.build_vpp_packed(layout, reqs, cost=cost)
    trace = sch.simulate(plan, cost, check=False)
    return Run(decompose(name or strategy, plan, trace, cost), plan, trace, cost, list(reqs))
