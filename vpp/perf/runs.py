"""One simulated run of a strategy: layout + requests + plan builder + cost model -> paper-style row.

Strategies: ``cpp`` (loop layout, fixed chunks, blocking), ``dcpp`` (loop layout, chunks from a DCPP
planner profiled on the cost model, blocking), ``vpp`` (fold-back V, blocking, Algorithm 1),
``vpp-async`` (V, reordered, non-blocking) and ``vpp-packed`` (VPP-Async with the dual-queue
cross-request packing of :func:`vpp.schedules.build_vpp_packed`, planned with the same cost model). ``layout`` / ``folds`` /
``partition`` override the strategy's layout (e.g. an interleaved layout run with the VPP builders).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import vpp.plan as sch
from vpp.plan.dcpp import DcppPlanner, dcpp_requests, profiled_stages, stage_measure

from .arch import Arch
from .deployment import DeploymentCost
from .decompose import Row, decompose
from .hardware import Device
from .ops import Parallel

STRATEGIES = sch.strategies.PLANNED


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
    if sch.strategies.get(strategy).chunking == "dcpp":
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
    spec = sch.strategies.get(strategy, STRATEGIES)
    lengths = [int(n) for n in ([lengths] if isinstance(lengths, int) else lengths)]
    if kind is None:
        kind = spec.layout
    layout = setup.layout(kind, folds if kind != "loop" else 1, partition)
    cost = setup.cost(layout)
    reqs = requests if requests is not None else requests_for(setup, strategy, lengths, chunk, cost, layout)
    if spec.layout == "loop" and kind != "loop":  # CPP's blocking order on another layout: VPP's builder
        plan = sch.build_vpp(layout, reqs)
    else:
        plan = spec.plan(layout, reqs, cost=cost)
    trace = sch.simulate(plan, cost, check=False)
    return Run(decompose(name or strategy, plan, trace, cost), plan, trace, cost, list(reqs))
