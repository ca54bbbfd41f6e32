"""Auto-tuner: pick layout, folds, partition, chunk budget, chunking, communication and context
parallelism by simulation.

Search, for one deployment (model, device, tp x pp devices) and a prompt length:

1. every layout kind (loop = CPP, fold-back V, Megatron interleaved) x folds (1..max_folds, 1 for loop)
   x partition (even; or balanced per rank on per-layer times at the middle of the prompt, embedding
   and head costed, :func:`vpp.schedules.balance_ranks`) x chunk budget x communication (blocking / async; a
   loop runs CPP blocking and DCPP as its extra chunking), with fixed chunks;
2. context parallelism on the same devices (``cp=True``): CP alone (one stage on cp ranks of tp x pp / cp
   devices each, chunks one after another) for every cp dividing the devices, and VPP-Async x CP (the
   V on pp ranks, each a CP group: tp / cp devices per CP rank), budgets scaled by cp
   (:class:`.cp.ContextParallelCost`; not for DSA);
3. the best few fixed-chunk pipelines again with the head/tail taper chunk planner (:mod:`.taper`).

The result is ranked by predicted TTFT, with the memory per device (weights, KV cache, peak activations)
and whether it fits, and compared with the paper's best configuration: VPP-Async on the V with one fold,
even partition, the best of the paper's four budgets, fixed chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dataclasses

import vpp.schedules as sch
from vpp.schedules.ir import Request

from .cp import ContextParallelCost, cp_rank_memory
from .decompose import decompose
from .rank_memory import rank_memory
from .runs import Setup, dcpp_chunking
from .taper import best_taper

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
    cp: int = 1                      # context-parallel ranks per stage
    pp: int | None = None            # pipeline ranks (None: the setup's)
    head: tuple = field(default=(), compare=False)  # a tapered chunking's ramps, in budgets (.taper)
    tail: tuple = field(default=(), compare=False)

    def describe(self) -> str:
        lay = "loop" if self.kind == "loop" else f"{self.kind} f={self.folds}"
        cp = f"CP{self.cp} x PP{self.pp}, " if self.cp > 1 else ""
        return f"{cp}{lay}, {self.partition} partition, budget {self.chunk}, {self.chunking} chunks, {self.comm}"


@dataclass
class Result:
    """``memory``: the busiest device's peak bytes (weights, KV cache, activations; :mod:`.rank_memory`),
    ``fits``: within the device's memory."""

    candidate: Candidate
    ttft: float
    bubble_ratio: float
    chunks: int
    memory: float = 0.0              # bytes on the heaviest device
    fits: bool = True
    breakdown: dict = field(default_factory=dict)


class NothingFits(ValueError):
    """No configuration of a tuning run fits in device memory; the message gives the figures."""


def candidate_setup(setup: Setup, cand: Candidate) -> Setup:
    """The deployment a candidate runs on: the setup's devices regrouped as pp x cp x tp."""
    if cand.cp == 1 and cand.pp in (None, setup.pp):
        return setup
    pp = cand.pp or setup.pp
    tp = setup.devices // (pp * cand.cp)
    return setup.replace(pp=pp, cp=cand.cp, par=dataclasses.replace(setup.par, tp=tp, ep=None))


def _layout(setup: Setup, cand: Candidate, length: int):
    if cand.partition == "balanced":
        return setup.balanced_layout(cand.kind, cand.chunk, length // 2, cand.folds)
    return setup.layout(cand.kind, cand.folds)


def evaluate(setup: Setup, cand: Candidate, length: int, sizes=None) -> Result:
    setup = candidate_setup(setup, cand)
    layout = _layout(setup, cand, length)
    cost = setup.cost(layout, "dcpp" if cand.chunking == "dcpp" else None)
    if sizes is not None:
        reqs = [Request(0, tuple(sizes))]
    elif cand.chunking == "dcpp":
        reqs = dcpp_chunking(setup, [length], cand.chunk, cost, layout)
    else:
        reqs = sch.chunk_requests([length], cand.chunk)
    order = "cpp" if cand.kind == "loop" else "vpp-async" if cand.comm == "async" else "vpp"
    sim = sch.simulate(order, layout, [length], cost, requests=reqs)
    plan, trace = sim.plan, sim.trace
    row = decompose(cand.describe(), plan, trace, cost, view="simulator")
    mems = cp_rank_memory(plan, trace, cost) if isinstance(cost, ContextParallelCost) else rank_memory(plan, trace, cost)
    worst = max(mems, key=lambda m: m.total)
    breakdown = {"weights": worst.weights, "kv_cache": worst.kv_cache, "activations": worst.activations}
    return Result(cand, row.total, row.bubble_ratio, row.chunks, worst.total, worst.total <= setup.device.mem_bytes,
                  breakdown)


def cp_candidates(setup: Setup, chunks=PAPER_CHUNKS) -> list[Candidate]:
    """CP alone and VPP-Async x CP on the setup's devices (see the module docstring)."""
    if setup.arch.attention == "dsa":
        return []
    out, n = [], setup.devices
    for cp in (2, 4, 8, 16, 32):
        tp = n // cp
        if n % cp == 0 and 1 <= tp <= 8 and setup.arch.heads % tp == 0:
            out += [Candidate("loop", 1, "even", c * cp, "blocking", cp=cp, pp=1) for c in chunks]
        if setup.pp > 1 and setup.par.tp % cp == 0 and setup.arch.heads % (setup.par.tp // cp) == 0:
            out += [Candidate("v", 1, "even", c * cp, "async", cp=cp, pp=setup.pp) for c in chunks]
    return out


def candidates(setup: Setup, chunks=PAPER_CHUNKS, max_folds: int = 2, kinds=("loop", "v", "interleaved"),
               partitions=("even", "balanced"), cp: bool = True) -> list[Candidate]:
    out = cp_candidates(setup, chunks) if cp else []
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
         kinds=("loop", "v", "interleaved"), partitions=("even", "balanced"), cp: bool = True) -> list[Result]:
    """Every evaluated configuration that fits in device memory, best first. Raises
    :class:`NothingFits` (with the smallest configuration's memory figures) when none does."""
    evaluated, seen = [], set()
    for c in candidates(setup, chunks, max_folds, kinds, partitions, cp):
        key = dataclasses.replace(c, chunk=min(c.chunk, length))   # budgets past the prompt are one chunk
        if key not in seen:
            seen.add(key)
            evaluated.append(evaluate(setup, c, length))
    results = [r for r in evaluated if r.fits]
    if not results:
        raise NothingFits(_nothing_fits(setup, length, evaluated))
    results.sort(key=lambda r: r.ttft)
    seen = set()
    for r in results[:]:
        c = r.candidate
        if len(seen) >= taper_top:
            break
        if c.chunking != "fixed" or c.cp > 1 or (c.kind, c.folds, c.partition, c.comm, c.chunk) in seen:
            continue
        seen.add((c.kind, c.folds, c.partition, c.comm, c.chunk))
        sizes, head, tail, ttft = best_taper(lambda s: evaluate(setup, c, length, s).ttft, length, c.chunk)
        if head or tail:
            tc = Candidate(c.kind, c.folds, c.partition, c.chunk, c.comm, f"taper head={head} tail={tail}", tuple(sizes),
                           head=tuple(head), tail=tuple(tail))
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


__all__ = [
    "Candidate", "NothingFits", "PAPER_CHUNKS", "Result", "candidate_setup", "candidates", "cp_candidates",
    "evaluate", "paper_best", "tune",
]
