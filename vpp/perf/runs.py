"""One simulated run of a strategy: layout + requests + plan builder + cost model -> paper-style row.

Strategies: ``cpp`` (loop layout, fixed chunks, blocking), ``dcpp`` (loop layout, chunks from a DCPP
planner profiled on the cost model, blocking), ``vpp`` (fold-back V, blocking, Algorithm 1),
``vpp-async`` (V, reordered, non-blocking) and ``vpp-packed`` (VPP-Async with the dual-queue
cross-request packing of :func:`vpp.schedules.build_vpp_packed`, planned with the same cost model). ``layout`` / ``folds`` /
``partition`` override the strategy's layout (e.g. an interleaved layout run with the VPP builders).

DCPP runs as vLLM-Ascend's recommended settings do: ``need_timing`` on (its default, the "online
calibration"), so the planner re-fits its history model from each step's measured time
(``dcpp_online``) and the model runner synchronises the device before every timed step
(``vllm_ascend/worker/model_runner_v1.py``: ``if need_timing: self._sync_device()``), which exposes the
host's per-step work as device idle (``Device.host_step``, booked as launch stall). ``dcpp_sync`` says
which steps sync: ``"calibration"`` (default) the steps the planner times, i.e. while
:attr:`vpp.schedules.dcpp.DcppPlanner.timing` is on (vLLM-Ascend main switches ``need_timing`` off once its
target is reset from three prefix-free steps and its history model is fitted over steps 5..30: a single
long request keeps timing, and syncing, on every step; a stream of prompts stops after its calibration);
``"every-step"`` every DCPP step (the model before issue 23). The synced steps are known by chunk shape
``(tokens, prefix)``: in a stream of equal prompts a later step of a timed shape is charged too (an
overestimate there). ``cp`` > 1 spreads
every stage over that many ring-attention ranks (:class:`.cp.ContextParallelCost`). ``shared_budget``
makes a stream of prompts share one token budget per step (:mod:`vpp.schedules.shared_budget`); DCPP then
plans each step under vLLM-Ascend's shared time budget and, with ``dcpp_online``, observes each step's
time (its pieces back to back on the profiled stages), syncing once per timed step. ``batched_steps``
runs each shared step as one forward (:mod:`.batched`: the GEMMs, MoE, norms and TP collectives once on
the step's tokens, attention per piece), as vLLM does; the plan keeps one COMPUTE per piece, whose
times sum to the step's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import vpp.schedules as sch
from vpp.schedules.dcpp import DcppPlanner, plan_online, profiled_stages, stage_measure
from vpp.schedules.shared_budget import shared_budget_stream

from .arch import Arch
from .cp import ContextParallelCost
from .deployment import DeploymentCost
from .decompose import Row, decompose
from .configs import canonical_name, get_config
from .hardware import Device
from .ops import Parallel, embed_ops, head_ops

SYNC_MODES = ("calibration", "every-step")


@dataclass
class Setup:
    """A deployment: architecture, device, per-stage parallelism and pipeline depth."""

    arch: Arch
    device: Device
    par: Parallel = field(default_factory=Parallel)
    pp: int = 2
    dcpp_variant: str = "vllm-ascend"
    dcpp_online: bool = True     # vLLM-Ascend's need_timing (default on): online re-fit and a device sync per step
    dcpp_sync: str = "calibration"   # which DCPP steps sync: SYNC_MODES (see the module docstring)
    cp: int = 1                  # context-parallel ranks per stage (each a TP group of par.tp devices)
    shared_budget: bool = False  # streams: one token budget per step shared by the requests (vpp.schedules.shared_budget)
    batched_steps: bool = False  # a shared step is one forward, attention per piece (vpp.perf.batched); else a call per piece
    packing_estimate: str = "cost"  # VPP + packing's window estimates: "cost" (this deployment) or "eq2" (Algorithm 2's law)

    @property
    def devices(self) -> int:
        return self.par.tp * self.cp * self.pp

    def layout(self, kind: str, folds: int = 1, partition=None):
        return sch.make_layout(kind, self.arch.layers, self.pp, folds=folds, partition=partition)

    def cost(self, layout, strategy: str | None = None) -> DeploymentCost:
        """The cost model of this deployment on ``layout``; a DCPP ``strategy`` with online timing
        synchronises the device before every step (see the module docstring)."""
        sync = bool(strategy) and self.dcpp_online and sch.strategies.get(strategy).chunking == "dcpp" \
            and self.dcpp_variant != "sglang"
        if self.packing_estimate not in ("cost", "eq2"):
            raise ValueError(f"packing_estimate={self.packing_estimate!r}; expected 'cost' or 'eq2'")
        if self.dcpp_sync not in SYNC_MODES:
            raise ValueError(f"dcpp_sync={self.dcpp_sync!r}; expected one of {SYNC_MODES}")
        only = set() if sync and self.dcpp_sync == "calibration" else None
        if self.cp > 1 and self.batched_steps:
            raise ValueError(f"batched_steps with cp={self.cp}: a batched step is not modelled under context "
                             f"parallelism (vpp.perf.batched); use cp=1 or batched_steps=False")
        if self.cp > 1:
            cost = ContextParallelCost(self.arch, self.device, layout, self.par, cp=self.cp, sync_steps=sync)
            cost.sync_only = only
            return cost
        return DeploymentCost(self.arch, self.device, layout, self.par, sync_steps=sync, sync_only=only,
                              batched_steps=self.batched_steps)

    def balanced_layout(self, kind: str, chunk: int, prefix: int, folds: int = 1):
        """A ``kind`` layout balanced per rank (:func:`vpp.schedules.balance_ranks`) on this deployment's
        per-layer times for a ``chunk``-token chunk after ``prefix`` cached tokens, with the embedding and
        the head costed on the stages that hold them."""
        cost = self.cost(self.layout(kind, folds))
        costs = [cost.layer_time(i, chunk, prefix) for i in range(self.arch.layers)]
        local = cost.local_tokens(chunk)
        embed = sum(self.device.op_time(op) for op in embed_ops(self.arch, local, cost.par))
        head = sum(self.device.op_time(op) for op in head_ops(self.arch, local, cost.par))
        return sch.make_layout(kind, self.arch.layers, self.pp, folds=folds, layer_costs=costs, embed_cost=embed,
                               head_cost=head, per_rank=True)

    def replace(self, **changes) -> "Setup":
        return dataclasses.replace(self, **changes)


@dataclass
class Run:
    row: Row
    plan: object
    trace: object
    cost: DeploymentCost
    requests: list


def dcpp_chunking(setup: Setup, lengths, chunk: int, cost, layout, arrivals=None, *,
                  concurrency: int | None = None, with_steps: bool = False):
    """Requests cut by the DCPP planner of ``setup`` (profiled on ``cost``); with ``dcpp_online`` the
    planner observes each chunk's time as it goes (one planner for the whole stream, as one engine
    keeps one), re-fitting its history model over the first observations. ``with_steps``: return
    ``(requests, steps)``, the steps shared by requests under ``setup.shared_budget`` (else None)."""
    stages = profiled_stages(layout, setup.dcpp_variant)
    planner = DcppPlanner(setup.dcpp_variant, budget=chunk, online=setup.dcpp_online)
    planner.profile(stage_measure(cost, stages))
    arrivals = [0.0] * len(lengths) if arrivals is None else list(arrivals)
    if setup.shared_budget:
        requests, steps = _shared_dcpp(setup, lengths, chunk, cost, stages, planner, arrivals, concurrency)
        return (requests, steps) if with_steps else requests
    if not setup.dcpp_online:
        requests = [sch.Request(i, tuple(planner.chunk_sizes(n)), a) for i, (n, a) in enumerate(zip(lengths, arrivals))]
        return (requests, None) if with_steps else requests

    def step(c: int, h: int) -> float:
        if cost.sync_only is not None and planner.timing:     # the runner syncs while the planner times
            cost.sync_only.add((c, h))
        return sum(cost.compute(s, c, h) for s in stages)

    sizes = plan_online(planner, lengths, step)
    requests = [sch.Request(i, tuple(c), a) for i, (c, a) in enumerate(zip(sizes, arrivals))]
    return (requests, None) if with_steps else requests


def _shared_dcpp(setup: Setup, lengths, chunk: int, cost, stages, planner: DcppPlanner, arrivals,
                 concurrency: int | None = None) -> tuple[list, list]:
    """DCPP under one shared token budget (:mod:`vpp.schedules.shared_budget`, vLLM-Ascend #9900's shared
    time budget): with ``dcpp_online`` the planner times each step (its pieces back to back, or with
    ``batched_steps`` the one forward) and re-fits from it; the device syncs once per timed step,
    before its first piece."""
    def step(shapes) -> None:
        if not (setup.dcpp_online and planner.timing):
            return
        if cost.sync_only is not None:
            cost.sync_only.add(shapes[0])
        if setup.batched_steps:        # the timed step is one forward (vpp.perf.batched)
            planner.observe_step(shapes, sum(sum(cost.step_compute(s, shapes)) for s in stages))
        else:
            planner.observe_step(shapes, sum(cost.compute(s, c, h) for c, h in shapes for s in stages))

    return shared_budget_stream(lengths, chunk, planner=planner, arrivals=arrivals,
                                on_step=step if setup.dcpp_online else None, concurrency=concurrency)


def run(setup: Setup, strategy: str, lengths, chunk: int, *, kind: str | None = None, folds: int = 1,
        partition=None, requests=None, name: str | None = None) -> Run:
    """Simulate ``strategy`` on prompts of ``lengths`` with chunk budget ``chunk`` (the one runner,
    :func:`vpp.schedules.runner.simulate`, on this deployment's cost model) and decompose the trace."""
    spec = sch.strategies.get(strategy, sch.strategies.PLANNED)
    lengths = [int(n) for n in ([lengths] if isinstance(lengths, int) else lengths)]
    if kind is None:
        kind = spec.layout
    layout = setup.layout(kind, folds if kind != "loop" else 1, partition)
    cost = setup.cost(layout, strategy)
    reqs = requests
    if reqs is None:   # DCPP: one planner profiled on this cost (online, as configured); else fixed chunks
        reqs = dcpp_chunking(setup, lengths, chunk, cost, layout) if spec.chunking == "dcpp" \
            else sch.chunk_requests(lengths, chunk)
    order = "vpp" if spec.layout == "loop" and kind != "loop" else strategy  # CPP's blocking order on another layout
    sim = sch.simulate(order, layout, lengths, cost, requests=reqs)
    return Run(decompose(name or strategy, sim.plan, sim.trace, cost), sim.plan, sim.trace, cost, list(reqs))


# Weight formats: DeepSeek-V3.1 (671B) and GLM-5.2 (744B) do not fit 16 x 64 GB in BF16, so W8A8 (the
# usual vLLM-Ascend format for them) is assumed; Qwen3-Coder-30B-A3B (61 GB in BF16) runs in BF16.
WEIGHT_BYTES = {"deepseek-v3.1": 1, "glm-5.2": 1, "qwen3-coder-30b-a3b": 2}
# KV cache: with a BF16 cache DeepSeek-V3.1 at 512K needs ~64.3 GB on its busiest NPU, over the 910C's
# 64 GB, yet the paper ran it: an 8-bit cache (vLLM-Ascend's C8 with W8A8) is assumed for the W8A8 models.
KV_BYTES = {"deepseek-v3.1": 1, "glm-5.2": 1, "qwen3-coder-30b-a3b": 2}
MODELS = tuple(WEIGHT_BYTES)


def paper_setup(model: str, device: Device, *, tp: int = 8, pp: int = 2) -> Setup:
    model = canonical_name(model)
    cfg = get_config(model)
    par = Parallel(tp=tp, weight_bytes=WEIGHT_BYTES.get(model, 2), kv_bytes=KV_BYTES.get(model, 2))
    return Setup(Arch.from_config(cfg, name=model), device, par, pp)


__all__ = ["KV_BYTES", "MODELS", "Run", "WEIGHT_BYTES", "paper_setup", "SYNC_MODES", "Setup", "dcpp_chunking", "run"]
