"""Context parallelism against the pipeline schedules, and the published CP anchor.

* :func:`anchor` -- Meta's context-parallel prefill (arXiv 2411.01783): Llama3-405B, a 1M-token prompt
  (2^20 tokens) in one forward on 128 H100s, TP8 inside each 8-GPU node and CP16 across 16 nodes, FP8
  (row-wise) weights for the linear layers, BF16 attention, load-balanced sharding, pass-KV ring
  attention. Published: 77 s, 93% parallel efficiency, ~63% of peak FLOPS. The model's TTFT is
  :func:`vpp.perf.cp.full_prefill` on the H100 preset; its efficiency compares CP16 with one node (CP1)
  scaled by 16, its utilisation divides the prefill's FLOPs by 128 GPUs x dense BF16 peak x TTFT.
* :func:`deployments` -- ways to spend ``devices`` devices on one prompt: CPP, DCPP, VPP-Async on TP x PP;
  CP (one pipeline stage of cp ranks, each a TP group; chunked prefill, chunks one after another) over
  every cp dividing ``devices``; VPP-Async x CP (PP = 2 stages, each a CP group).
* :func:`evaluate` -- one deployment at one length: the best chunk budget's TTFT (budgets are tokens per
  device: a CP group of cp ranks takes cp x the budget) and the memory per device (the heaviest device:
  weights, KV cache, peak activations), and whether it fits the device.
"""

from __future__ import annotations

from dataclasses import dataclass

from vpp.perf.arch import Arch
from vpp.perf.configs import LLAMA3_405B
from vpp.perf.cp import ContextParallelCost, cp_rank_memory, full_prefill, model_flops
from vpp.perf.hardware import H100, Device
from vpp.perf.rank_memory import rank_memory
from vpp.perf.ops import Parallel
from vpp.perf.runs import Setup, run

from benchmarks.paper.published import CHUNKS

ANCHOR = {"name": "llama3-405b-1m-128xh100", "tokens": 1 << 20, "tp": 8, "cp": 16, "ttft_s": 77.0,
          "efficiency": 0.93, "utilization": 0.63,
          "source": "arXiv 2411.01783 (Meta, 'Context Parallelism for Scalable Million-Token Inference'), abstract: "
                    "1M-token prefill of Llama3 405B in 77 s on 128 H100s in 16 nodes, 93% parallelization "
                    "efficiency, 63% FLOPS utilization"}

# Every published Llama3-405B prefill time of arXiv 2411.01783 the model can be set against (TP8 per node;
# CP = nodes). The anchor is the first; the one-host times are the paper's motivation (a single 8-GPU host).
META_POINTS = (
    {"name": "1M, 16 nodes (anchor)", "tokens": 1 << 20, "cp": 16, "seconds": 77.0, "source": "abstract"},
    {"name": "128K, 16 nodes", "tokens": 1 << 17, "cp": 16, "seconds": 3.8, "source": "abstract"},
    {"name": "128K, one host", "tokens": 1 << 17, "cp": 1, "seconds": 60.0, "source": "introduction (~60 s)"},
    {"name": "1M, one host", "tokens": 1 << 20, "cp": 1, "seconds": 1200.0, "source": "introduction (~1200 s)"},
)
ANCHOR_TOL = 0.15


def meta_points(device: Device = H100) -> list[dict]:
    """The model against each of :data:`META_POINTS` (nothing fitted: the H100 preset), with the per-ring-step
    cost each CP16 point would need on top of the model's (``needed_step_ms``: the gap spread over the
    ``(cp - 1) x layers`` ring steps), which shows whether one ring-synchronisation constant could close both."""
    par = Parallel(tp=ANCHOR["tp"], weight_bytes=1)
    out = []
    for p in META_POINTS:
        t = full_prefill(LLAMA3_405B, device, par, p["cp"], p["tokens"])
        steps = (p["cp"] - 1) * LLAMA3_405B.layers
        out.append({**p, "model_s": t, "error": t / p["seconds"] - 1, "within": abs(t / p["seconds"] - 1) <= ANCHOR_TOL,
                    "needed_step_ms": 1e3 * (p["seconds"] - t) / steps if steps else None})
    return out


def anchor(device: Device = H100, tokens: int = ANCHOR["tokens"]) -> dict:
    """The model's numbers for Meta's 1M-token Llama3-405B prefill (see the module docstring)."""
    par = Parallel(tp=ANCHOR["tp"], weight_bytes=1)          # FP8 row-wise linear layers, BF16 activations
    arch = LLAMA3_405B
    t16 = full_prefill(arch, device, par, ANCHOR["cp"], tokens)
    t1 = full_prefill(arch, device, par, 1, tokens)
    gpus = ANCHOR["tp"] * ANCHOR["cp"]
    return {"name": ANCHOR["name"], "tokens": tokens, "gpus": gpus, "ttft_s": t16, "paper_ttft_s": ANCHOR["ttft_s"],
            "error": t16 / ANCHOR["ttft_s"] - 1, "one_node_s": t1, "efficiency": t1 / (ANCHOR["cp"] * t16),
            "paper_efficiency": ANCHOR["efficiency"],
            "utilization": model_flops(arch, tokens) / (gpus * device.peak_flops * t16),
            "paper_utilization": ANCHOR["utilization"], "device": device.name, "source": ANCHOR["source"]}


@dataclass(frozen=True)
class Deployment:
    name: str
    strategy: str
    setup: Setup

    @property
    def shape(self) -> str:
        s = self.setup
        return f"TP{s.par.tp} x PP{s.pp}" + (f" x CP{s.cp}" if s.cp > 1 else "")


def deployments(arch: Arch, device: Device, *, devices: int = 16, weight_bytes: int = 1,
                kv_bytes: int = 2) -> list[Deployment]:
    """The contenders for ``devices`` devices (see the module docstring). TP never exceeds 8 (one
    node's fast link); shapes whose heads do not split are skipped. ``kv_bytes``: the KV cache format
    (paper_repro's: 1 for the W8A8 models, :data:`benchmarks.paper.sweep.KV_BYTES`)."""
    par = lambda tp: Parallel(tp=tp, weight_bytes=weight_bytes, kv_bytes=kv_bytes)
    ok = lambda tp: arch.heads % tp == 0 and tp <= 8
    out = []
    if ok(8) and devices % 8 == 0:
        pp = devices // 8
        base = Setup(arch, device, par(8), pp)
        out += [Deployment(n, s, base) for n, s in (("CPP", "cpp"), ("DCPP", "dcpp"), ("VPP-Async", "vpp-async"))]
    for cp in (2, 4, 8, 16):
        tp = devices // cp
        if devices % cp == 0 and ok(tp) and arch.attention != "dsa":
            out.append(Deployment(f"CP{cp}", "cpp", Setup(arch, device, par(tp), 1, cp=cp)))
    for cp in (2, 4):
        tp = devices // (2 * cp)
        if devices % (2 * cp) == 0 and tp >= 1 and ok(tp) and arch.attention != "dsa":
            out.append(Deployment(f"VPP-Async x CP{cp}", "vpp-async", Setup(arch, device, par(tp), 2, cp=cp)))
    return out


@dataclass
class Outcome:
    deployment: Deployment
    length: int
    chunk: int
    ttft: float
    memory: float            # bytes on the heaviest device
    weights: float
    kv: float
    activations: float

    @property
    def fits(self) -> bool:
        return self.memory <= self.deployment.setup.device.mem_bytes

    def to_dict(self) -> dict:
        d = self.deployment
        return {"deployment": d.name, "shape": d.shape, "strategy": d.strategy, "length": self.length,
                "chunk": self.chunk, "ttft_s": self.ttft, "memory_gb": self.memory / 1e9, "weights_gb": self.weights / 1e9,
                "kv_gb": self.kv / 1e9, "activations_gb": self.activations / 1e9, "fits": self.fits}


def evaluate(dep: Deployment, length: int, chunks=CHUNKS) -> Outcome:
    """``dep`` at its best budget for a ``length``-token prompt, with its memory per device."""
    best = None
    for c in chunks:
        budget = c * dep.setup.cp
        if budget > 2 * length:
            continue
        r = run(dep.setup, dep.strategy, [length], budget)
        if best is None or r.row.total < best[1].row.total:
            best = (budget, r)
    budget, r = best
    mems = cp_rank_memory(r.plan, r.trace, r.cost) if isinstance(r.cost, ContextParallelCost) \
        else rank_memory(r.plan, r.trace, r.cost)
    top = max(mems, key=lambda m: m.total)
    return Outcome(dep, length, budget, r.row.total, top.total, top.weights, top.kv_cache, top.activations)
