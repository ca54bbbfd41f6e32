"""Auto-tuner: pick layout, folds, partition, chunk budget, chunking and communication by simulation.

Search, for one deployment (model, device, tp, pp) and a prompt length:

1. every layout kind (loop = CPP, fold-back V, Megatron interleaved) x folds (1..max_folds, 1 for loop)
   x partition (even; or cost-balanced by the stage partitioner, :func:`vpp.schedules.balance`, on
   per-layer times at the middle of the prompt) x chunk budget x communication (blocking / async; a loop
   runs CPP blocking and DCPP as its extra chunking), with fixed chunks;
2. the best few of those again with the head/tail taper chunk planner (:mod:`.taper`).

The result is ranked by predicted TTFT and compared with the paper's best configuration: VPP-Async on
the V with one fold, even partition, the best of the paper's four budgets, fixed chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import vpp.plan as sch
from vpp.plan.ir import Request

from .runs import Setup, requests_for
from .taper import best_taper
from .decompose import decompose
from .memory import rank_memory

PAPER_CHUNKS = (8192, 16384, 24576, 32768)


@dataclass(frozen=True)
class Candidate:
    kind: str
    folds: int
    partition: str
    chunk: int
    comm: str
    chunking: str = "fixed"
    sizes: tuple = field(default=(), compare=False)

    def describe(self) -> str:
        lay = "loop" if self.kind == "loop" else f"{self.kind} f={self.folds}"
        return f"{lay}, {self.partition} partition, budget {self.chunk}, {self.chunking} chunks, {self.comm}"


@dataclass
class Result:
    """``memory``: the busiest device's peak bytes (weights, KV cache, activations; :mod:`.memory`),
    ``fits``: within the device's memory."""

    candidate: Candidate
    ttft: float
    bubble_ratio: float
    chunks: int
    memory: float = 0.0
    fits: bool = True
    breakdown: dict = field(default_factory=dict)


class NothingFits(ValueError):
    """No configuration of a tuning run fits in device memory; the message gives the figures."""


def _layout(setup: Setup, cand: Candidate, length: int):
    layout = setup.layout(cand.kind, cand.folds)
    if cand.partition == "balanced":
        cost = setup.cost(layout)
        costs = [cost.layer_time(i, cand.chunk, length // 2) for i in range(setup.arch.layers)]
        layout = sch.make_layout(cand.kind, setup.arch.layers, setup.pp, folds=cand.folds, layer_costs=costs,
                                 embed_cost=costs[0] * 0.01, head_cost=costs[-1] * 0.01)
    return layout


def evaluate(setup: Setup, cand: Candidate, length: int, sizes=None) -> Result:
    layout = _layout(setup, cand, length)
    cost = setup.cost(layout)
    if sizes is not None:
        reqs = [Request(0, tuple(sizes))]
    elif cand.chunking == "dcpp":
        reqs = requests_for(setup, "dcpp", [length], cand.chunk, cost, layout)
    else:
        reqs = sch.chunk_requests([length], cand.chunk)
    if cand.kind == "loop":
        plan = sch.build_cpp(layout, reqs)
    elif cand.comm == "async":
        plan = sch.build_vpp_async(layout, reqs)
    else:
        plan = sch.build_vpp(layout, reqs)
    trace = sch.simulate(plan, cost, check=False)
    row = decompose(cand.describe(), plan, trace, cost, view="simulator")
    worst = max(rank_memory(plan, trace, cost), key=lambda m: m.total)
    breakdown = {"weights": worst.weights, "kv_cache": worst.kv_cache, "activations": worst.activations}
    return Result(cand, row.total, row.bubble_ratio, row.chunks, worst.total, worst.total <= setup.device.mem_bytes,
                  breakdown)


def candidates(setup: Setup, chunks=PAPER_CHUNKS, max_folds: int = 2, kinds=("loop", "v", "interleaved"),
               partitions=("even", "balanced")) -> list[Candidate]:
    out = []
    for kind in kinds:
        folds = [1] if kind == "loop" else range(1, max_folds + 1)
        for f in folds:
            if kind != "loop" and 2 * f * setup.pp > setup.arch.layers:
                continue
            for part in partitions:
                for chunk in chunks:
                    if kind == "loop":
                        out += [Candidate(kind, 1, part, chunk, "blocking"),
                                Candidate(kind, 1, part, chunk, "blocking", "dcpp")]
                    else:
                        out += [Candidate(kind, f, part, chunk, c) for c in ("blocking", "async")]
    return out


def paper_best(setup: Setup, length: int, chunks=PAPER_CHUNKS) -> Result:
    """The paper's best configuration: VPP-Async, V with one fold, even partition, best budget."""
    return min((evaluate(setup, Candidate("v", 1, "even", c, "async"), length) for c in chunks), key=lambda r: r.ttft)


def tune(setup: Setup, length: int, *, chunks=PAPER_CHUNKS, max_folds: int = 2, taper_top: int = 3,
         kinds=("loop", "v", "interleaved"), partitions=("even", "balanced")) -> list[Result]:
    """Every evaluated configuration that fits in device memory, best first. Raises
    :class:`NothingFits` (with the smallest configuration's memory figures) when none does."""
    evaluated = [evaluate(setup, c, length) for c in candidates(setup, chunks, max_folds, kinds, partitions)]
    results = [r for r in evaluated if r.fits]
    if not results:
        raise NothingFits(_nothing_fits(setup, length, evaluated))
    results.sort(key=lambda r: r.ttft)
    seen = set()
    for r in results[:]:
        c = r.candidate
        if len(seen) >= taper_top:
            break
        if c.chunking != "fixed" or (c.kind, c.folds, c.partition, c.comm, c.chunk) in seen:
            continue
        seen.add((c.kind, c.folds, c.partition, c.comm, c.chunk))
        sizes, head, tail, ttft = best_taper(lambda s: evaluate(setup, c, length, s).ttft, length, c.chunk)
        if head or tail:
            tc = Candidate(c.kind, c.folds, c.partition, c.chunk, c.comm, f"taper head={head} tail={tail}", tuple(sizes))
            results.append(evaluate(setup, tc, length, sizes))
    results.sort(key=lambda r: r.ttft)
    return results


def _nothing_fits(setup: Setup, length: int, evaluated: list[Result]) -> str:
    small = min(evaluated, key=lambda r: r.memory)
    gb = lambda b: f"{b / 1e9:.1f} GB"
    parts = ", ".join(f"{k} {gb(v)}" for k, v in small.breakdown.items())
    return (f"none of {len(evaluated)} configurations of {setup.arch.name} at tp={setup.par.tp} pp={setup.pp} for "
            f"{length} tokens fits in {setup.device.name}'s {gb(setup.device.mem_bytes)}: the smallest needs "
            f"{gb(small.memory)} on its busiest device ({parts}; {small.candidate.describe()})")
