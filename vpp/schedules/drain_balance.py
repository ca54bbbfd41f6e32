"""Partitions chosen on the whole prompt: among partitions equally balanced per rank, the one whose
simulated prefill ends first.

A per-rank balance (:mod:`.rank_balance`) looks at one chunk. It cannot see where the work that grows
from chunk to chunk lands at the two ends of the run. On a V of P = 2 ranks, rank 0 holds the first
and the last stage: the first stage of the first chunk runs alone at the start (the fill, at the
smallest tau_k) and the last stage of the last chunk runs alone at the end (the drain, at the largest).
Two partitions with the same rank totals therefore differ by how much of rank 0's work sits in the
drain. Six equal layers as ``1/1/2/2`` put two layers in the last stage, ``2/1/2/1`` one; with
``tau'_k = 70 + 48 k`` ms per layer and 8 chunks of 1024 tokens, VPP-Async then takes 0.952 and 0.907
of CPP's makespan (the simulator; 0.927 for the paper's even split of rank 0's work, which
``tau_{k-1} + tau_{k+1} = 2 tau_k`` balances in the steady state but which leaves half of rank 0's
work in the drain). In closed form, with ``S`` a rank's total work and ``tau_k`` a rank's work on
chunk k: CPP takes ``S + tau_{N-1}`` and the V with rank 0's work split evenly ``S + (tau_0 +
tau_{N-1}) / 2``; a heavier first stage moves rank 0's share of the drain to the fill.

:func:`fastest_partition` simulates the strategy's plan over the prompt's chunks once per candidate,
each stage's compute the sum of its layers' ``layer_time(layer, tokens, prefix)`` plus the embedding
on the first stage and the head on the last, and returns the fastest (ties keep the candidates'
order, so the per-rank balancer's favourite wins when the simulation cannot tell them apart).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

from . import strategies
from .ir import Request
from .layout import make_layout
from .simulator import simulate_plan

LayerTime = Callable[[int, int, int], float]   # (layer, tokens, prefix) -> seconds
EdgeTime = Callable[[int, int], float]         # (tokens, prefix) -> seconds


@dataclass(frozen=True)
class _LayerSumCost:
    """A stage's compute as the sum of its layers' (simulator :class:`~.cost.Cost`); free transfers."""

    bounds: tuple[tuple[int, int], ...]
    layer_time: Callable[[int, int, int], float]
    embed_time: EdgeTime | None = None
    head_time: EdgeTime | None = None
    overlap: float = 1.0

    def compute(self, stage: int, tokens: int, prefix: int) -> float:
        a, b = self.bounds[stage]
        t = sum(self.layer_time(i, tokens, prefix) for i in range(a, b))
        if stage == 0 and self.embed_time is not None:
            t += self.embed_time(tokens, prefix)
        if stage == len(self.bounds) - 1 and self.head_time is not None:
            t += self.head_time(tokens, prefix)
        return t

    def transfer(self, tokens: int) -> float:
        return 0.0


def simulated_makespans(strategy: str, kind: str, pp: int, candidates: Sequence[Sequence[int]],
                        chunk_sizes: Sequence[int], layer_time: LayerTime, *, folds: int = 1,
                        embed_time: EdgeTime | None = None, head_time: EdgeTime | None = None) -> list[float]:
    """Simulated makespan of one prompt cut into ``chunk_sizes`` under ``strategy`` on a ``kind``
    layout, for each candidate partition (layers per stage)."""
    if not candidates:
        raise ValueError("no candidate partitions to simulate")
    num_layers = sum(candidates[0])
    strat = strategies.get(strategy)
    if strat.builder is None:          # gpipe: PyTorch schedules it; its simulated counterpart is CPP
        strat = strategies.get("cpp")
    layout = make_layout(kind, num_layers, pp, folds=folds, partition=candidates[0])
    plan = strat.plan(layout, [Request(0, tuple(chunk_sizes))])   # the actions do not depend on the partition
    cached = lru_cache(maxsize=None)(layer_time)
    out = []
    for part in candidates:
        bounds = make_layout(kind, num_layers, pp, folds=folds, partition=part).stage_layers
        cost = _LayerSumCost(bounds, cached, embed_time, head_time, overlap=0.0 if plan.comm == "blocking" else 1.0)
        out.append(simulate_plan(plan, cost, check=False).makespan)
    return out


def fastest_partition(strategy: str, kind: str, pp: int, candidates: Sequence[Sequence[int]],
                      chunk_sizes: Sequence[int], layer_time: LayerTime, *, folds: int = 1,
                      embed_time: EdgeTime | None = None, head_time: EdgeTime | None = None) -> tuple[int, ...]:
    """The candidate whose simulated prefill ends first (see the module docstring); the first on a tie."""
    spans = simulated_makespans(strategy, kind, pp, candidates, chunk_sizes, layer_time, folds=folds,
                                embed_time=embed_time, head_time=head_time)
    best = min(range(len(candidates)), key=lambda i: (round(spans[i], 12), i))
    return tuple(int(n) for n in candidates[best])


__all__ = ["EdgeTime", "LayerTime", "fastest_partition", "simulated_makespans"]
