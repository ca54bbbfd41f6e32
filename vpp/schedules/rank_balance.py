"""Partitions balanced per rank: the heaviest *rank*, not the heaviest stage.

A rank holds several stages (in a V, rank 0 holds the first and the last, with the embedding and the
LM head), and what a pipeline waits for is a rank's total work per chunk. :func:`balance_ranks` cuts
``costs`` (one per layer) into contiguous stages and minimises, in this order:

1. the heaviest rank's cost (the sum of its stages', the embedding on stage 0, the head on the last),
   where partitions within ``tolerance`` (default 0.5%) of the optimum count as equal -- so that a few
   percent of per-layer noise (a dense layer slightly cheaper than a MoE one) cannot buy a lopsided
   V such as 1/16/15/29 layers over 15/16/15/15 -- but never above the seeds' heaviest rank;
2. the sum of squared stage costs (stages alike: the drain is the last stage of the last chunk);
3. the heaviest rank's cost itself, then the last stage's cost.

Search. Stage boundaries are chosen among ``allowed`` starts (default: every layer; a DSA model whose
layers share an indexer cannot be cut between them). When the number of boundary sets is at most
``exact_limit`` every one is tried, so the result is optimal. Otherwise a descent starts from the best of
``seeds`` (partitions to improve on, e.g. the per-stage balancer's, :func:`vpp.schedules.layout.balance`, as
:func:`vpp.schedules.make_layout` passes it) and the even split, and moves one boundary at a time to any
allowed position between its neighbours while the objective improves; it returns a partition no worse
than any seed, in particular never heavier on its heaviest rank than the per-stage balancer's. One
boundary at a time can stall above the optimum (a V of 2 ranks over costs 1 5 6 3 7 6, embedding 2 and
head 3, stalls at 19 against 17), so on a V of one fold (the paper's layout) the descent also starts
from the optimum of the heaviest rank, :func:`_fold_back_optimum`: the heaviest rank is then optimal
(within ``tolerance``) at any size.
"""

from __future__ import annotations

import itertools
import math
import numbers
from typing import Callable, Sequence

import numpy as np

EXACT_LIMIT = 400_000


def rank_loads(partition: Sequence[int], costs: Sequence[float], stage_ranks: Sequence[int], *,
               embed_cost: float = 0.0, head_cost: float = 0.0) -> list[float]:
    """Per rank, the summed cost of its stages under ``partition`` (layers per stage)."""
    loads = [0.0] * (max(stage_ranks) + 1)
    for s, c in enumerate(stage_costs(partition, costs, embed_cost=embed_cost, head_cost=head_cost)):
        loads[stage_ranks[s]] += c
    return loads


def stage_costs(partition: Sequence[int], costs: Sequence[float], *, embed_cost: float = 0.0,
                head_cost: float = 0.0) -> list[float]:
    out, start = [], 0
    for n in partition:
        out.append(sum(costs[start:start + n]))
        start += n
    out[0] += embed_cost
    out[-1] += head_cost
    return out


def _objective(stage_ranks, costs, embed_cost, head_cost) -> Callable[[Sequence[int]], tuple]:
    """score(bounds): (heaviest rank, sum of squared rank costs, sum of squared stage costs, last stage)
    of the partition whose inner stage boundaries are ``bounds``."""
    pre = [0.0, *itertools.accumulate(costs)]
    n, ranks = len(costs), max(stage_ranks) + 1
    r = lambda x: round(x, 12)   # float noise must not break ties between equal partitions

    def score(bounds: Sequence[int]) -> tuple:
        edges = (0, *bounds, n)
        loads = [0.0] * ranks
        sq = 0.0
        for s in range(len(edges) - 1):
            c = pre[edges[s + 1]] - pre[edges[s]]
            if s == 0:
                c += embed_cost
            if s == len(edges) - 2:
                c += head_cost
                last = c
            loads[stage_ranks[s]] += c
            sq += c * c
        return (r(max(loads)), r(sum(x * x for x in loads)), r(sq), r(last))
    return score


def _from_bounds(bounds: Sequence[int], n: int) -> tuple[int, ...]:
    edges = [0, *bounds, n]
    return tuple(b - a for a, b in zip(edges, edges[1:]))


def balance_ranks(costs: Sequence[float], stage_ranks: Sequence[int], *, embed_cost: float = 0.0,
                  head_cost: float = 0.0, allowed: Sequence[int] | None = None,
                  seeds: Sequence[Sequence[int]] = (), exact_limit: int = EXACT_LIMIT,
                  tolerance: float = 0.005) -> tuple[int, ...]:
    """Layers per stage minimising the heaviest rank (see the module docstring)."""
    n, stages = len(costs), len(stage_ranks)
    _check_inputs(costs, stage_ranks, embed_cost, head_cost, tolerance)
    cuts = sorted(set(range(1, n)) if allowed is None else {a for a in allowed if 0 < a < n})
    if len(cuts) < stages - 1:
        raise ValueError(f"{n} layers with stage starts {[0] + cuts} allow {len(cuts) + 1} stages, "
                         f"{stages} asked for")
    if stages == 1:
        return (n,)
    score = _objective(tuple(stage_ranks), list(costs), embed_cost, head_cost)
    starts = _starts(seeds, stages, cuts, n)
    if math.comb(len(cuts), stages - 1) > exact_limit and _is_fold_back(stage_ranks):
        starts.append(_fold_back_optimum(costs, len(stage_ranks) // 2, cuts, embed_cost, head_cost, tolerance,
                                         [score(b)[0] for b in starts[:len(seeds)]]))
    if math.comb(len(cuts), stages - 1) <= exact_limit:
        return _exact(costs, stage_ranks, embed_cost, head_cost, cuts, [score(b)[0] for b in starts[:len(seeds)]],
                      tolerance)
    return _descend(starts, cuts, n, score)


def _check_inputs(costs, stage_ranks, embed_cost, head_cost, tolerance) -> None:
    """One line for what no partition can come from: no stage, ranks that are not 0..R-1, a cost or
    tolerance that is negative or not finite (NaN would compare false everywhere and pick garbage)."""
    ranks = list(stage_ranks)
    if not ranks:
        raise ValueError("stage_ranks is empty: a partition needs at least one stage")
    if len(costs) == 0:
        raise ValueError(f"costs is empty: {len(ranks)} stages need at least one layer each")
    if any(isinstance(r, bool) or not isinstance(r, numbers.Integral) or r < 0 for r in ranks) \
            or set(ranks) != set(range(max(ranks) + 1)):
        raise ValueError(f"stage_ranks {ranks} must be ranks 0..R-1, each holding a stage")
    values = [("layer cost", c) for c in costs] + [("embed_cost", embed_cost), ("head_cost", head_cost)]
    bad = next(((what, c) for what, c in values
                if isinstance(c, bool) or not isinstance(c, numbers.Real) or not 0 <= c < math.inf), None)
    if bad is not None:
        raise ValueError(f"layer, embedding and head costs must be finite numbers >= 0, got {bad[0]} {bad[1]!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not 0 <= tolerance < math.inf:
        raise ValueError(f"tolerance={tolerance!r} must be a finite number >= 0")


def balanced_candidates(costs: Sequence[float], stage_ranks: Sequence[int], *, embed_cost: float = 0.0,
                        head_cost: float = 0.0, allowed: Sequence[int] | None = None, limit: int = 32,
                        exact_limit: int = EXACT_LIMIT, tolerance: float = 0.005) -> list[tuple[int, ...]]:
    """The partitions that tie with :func:`balance_ranks`'s on the heaviest rank (within ``tolerance``),
    best first by its order, at most ``limit``; ``[balance_ranks(...)]`` when there are more than
    ``exact_limit`` boundary sets to try. A per-chunk snapshot cannot tell these apart; a simulation of
    the whole prompt can (:func:`vpp.schedules.drain_balance.fastest_partition`)."""
    n, stages = len(costs), len(stage_ranks)
    cuts = sorted(set(range(1, n)) if allowed is None else {a for a in allowed if 0 < a < n})
    best = balance_ranks(costs, stage_ranks, embed_cost=embed_cost, head_cost=head_cost, allowed=allowed,
                         exact_limit=exact_limit, tolerance=tolerance)
    if stages == 1 or math.comb(len(cuts), stages - 1) > exact_limit:
        return [best]
    ranked = _exact(costs, stage_ranks, embed_cost, head_cost, cuts, [], tolerance, every=True)
    return ranked[:max(1, limit)]


def _exact(costs, stage_ranks, embed_cost, head_cost, cuts, seed_tops, tolerance, every: bool = False):
    """Every boundary set at once (numpy): the heaviest rank's optimum, then among the sets within
    ``tolerance`` of it (and no heavier than any seed) the most even stages, then the lighter heaviest
    rank, then the lighter last stage. ``every``: all the sets within tolerance, in that order."""
    n, stages = len(costs), len(stage_ranks)
    pre = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=np.float64))])
    bounds = np.array(list(itertools.combinations(cuts, stages - 1)), dtype=np.int64).reshape(-1, stages - 1)
    edges = np.hstack([np.zeros((len(bounds), 1), np.int64), bounds, np.full((len(bounds), 1), n)])
    stage = pre[edges[:, 1:]] - pre[edges[:, :-1]]
    stage[:, 0] += embed_cost
    stage[:, -1] += head_cost
    loads = np.zeros((len(bounds), max(stage_ranks) + 1))
    for s, r in enumerate(stage_ranks):
        loads[:, r] += stage[:, s]
    top = np.round(loads.max(axis=1), 12)
    cap = min([top.min() * (1 + tolerance)] + list(seed_tops))
    ok = np.flatnonzero(top <= cap + 1e-12)
    keys = (np.round(stage[ok, -1], 12), top[ok], np.round((stage[ok] ** 2).sum(axis=1), 12))
    order = ok[np.lexsort(keys)]                         # lexsort: the last key is the primary one
    if every:
        return [_from_bounds(bounds[i].tolist(), n) for i in order]
    return _from_bounds(bounds[order[0]].tolist(), n)


def _starts(seeds, stages, cuts, n) -> list[list[int]]:
    out = []
    for part in seeds:
        bounds = list(itertools.accumulate(part))[:-1]
        if len(part) != stages or sum(part) != n or not set(bounds) <= set(cuts):
            raise ValueError(f"seed partition {list(part)} is not {stages} stages of {n} layers on the allowed starts")
        out.append(bounds)
    step = len(cuts) / stages
    even = sorted({cuts[min(len(cuts) - 1, int(round(step * (i + 1))) - 1)] for i in range(stages - 1)})
    if len(even) == stages - 1:
        out.append(even)
    else:
        out.append(cuts[:stages - 1])
    return out


def _is_fold_back(stage_ranks: Sequence[int]) -> bool:
    """``stage_ranks`` is a V of one fold: 0, 1, .., P-1, P-1, .., 1, 0."""
    half = len(stage_ranks) // 2
    return len(stage_ranks) == 2 * half and list(stage_ranks) == [*range(half), *reversed(range(half))]


def _fold_back_optimum(costs, num_ranks: int, cuts: list[int], embed_cost: float, head_cost: float,
                       tolerance: float = 0.0, seed_tops: Sequence[float] = ()) -> list[int]:
    """Inner boundaries of a V of ``num_ranks`` ranks (one fold) whose heaviest rank is the lightest,
    within ``tolerance`` of it and no heavier than any of ``seed_tops`` (as :func:`_exact` counts ties).

    Rank r holds stages r and 2P-1-r, so walking the V from the outside in, each rank takes a block off
    the front and a block off the back of what is left, [i, j), and rank P-1 takes the rest, cut once.
    For a bound B, ok_r[i, j] says ranks r .. P-1 can share [i, j) with none above B:
    ok_{P-1}[i, j] iff pre[j] - pre[i] <= B and an allowed cut lies strictly inside; for r < P-1,
    ok_r[i, j] iff some i < i' < j' < j (allowed cuts) has ok_{r+1}[i', j'] and
    pre[i'] - pre[i] + pre[j] - pre[j'] <= B, i.e. min over those (i', j') of pre[i'] - pre[j'] is at
    most B - pre[j] + pre[i]: a suffix minimum over i' and a prefix minimum over j' of one matrix, so a
    test costs O(P K^2) for K boundary points. Bisection on B down to float precision (every rank load
    is a sum of layer costs, so the last feasible B is the optimum up to rounding), then, at B relaxed by
    the tolerance, a witness that takes, rank by rank, the two stages closest to the mean stage cost
    among those that keep B feasible."""
    n = len(costs)
    pts = np.array([0, *cuts, n])
    pre = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=np.float64))])[pts]
    k = len(pts)
    a_idx, b_idx = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
    span = pre[None, :] - pre[:, None]                                    # span[a, b] = pre[b] - pre[a]
    edge = np.where(a_idx == 0, embed_cost, 0.0) + np.where(b_idx == k - 1, head_cost, 0.0)
    inner = (a_idx > 0) & (b_idx < k - 1)

    def levels(bound: float) -> list[np.ndarray]:
        ok = [None] * num_ranks
        ok[-1] = (b_idx - a_idx >= 2) & (span + edge <= bound)
        for r in range(num_ranks - 2, -1, -1):
            v = np.where(ok[r + 1] & inner, pre[:, None] - pre[None, :], np.inf)   # pre[a'] - pre[b']
            v = np.minimum.accumulate(v[::-1], axis=0)[::-1]                       # over a' >= a
            v = np.minimum.accumulate(v, axis=1)                                   # over b' <= b
            best = np.full((k, k), np.inf)
            best[:-1, 1:] = v[1:, :-1]                                             # a' > a, b' < b
            ok[r] = best <= bound - span - edge
        return ok

    lo, hi = 0.0, float(pre[-1]) + embed_cost + head_cost
    tol = 1e-12 * max(hi, 1.0)
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if levels(mid)[0][0, k - 1]:
            hi = mid
        else:
            lo = mid
    hi = max(hi, min([hi * (1 + tolerance), *seed_tops]))
    ok, a, b, front, back = levels(hi), 0, k - 1, [], []
    mean = (float(pre[-1]) + embed_cost + head_cost) / (2 * num_ranks)
    for r in range(num_ranks - 1):   # the witness, tested exactly as ``levels`` did
        fits = ok[r + 1] & inner & (pre[:, None] - pre[None, :] <= hi - span[a, b] - edge[a, b])
        fits[:a + 1, :] = False
        fits[:, b:] = False
        cand = np.argwhere(fits)          # of those, the pair whose two stages come closest to the mean
        front_cost = pre[cand[:, 0]] - pre[a] + (embed_cost if a == 0 else 0.0)
        back_cost = pre[b] - pre[cand[:, 1]] + (head_cost if b == k - 1 else 0.0)
        a, b = (int(x) for x in cand[np.argmin((front_cost - mean) ** 2 + (back_cost - mean) ** 2)])
        front.append(int(pts[a]))
        back.append(int(pts[b]))
    half = (pre[a] + pre[b]) / 2                 # rank P-1's cut: its two stages as even as the cuts allow
    mid = int(pts[min(range(a + 1, b), key=lambda c: abs(pre[c] - half))])
    return [*front, mid, *reversed(back)]


def _descend(starts: list[list[int]], cuts: list[int], n: int, score) -> tuple[int, ...]:
    best = min(starts, key=score)
    best_score = score(best)
    improved = True
    while improved:
        improved = False
        for i in range(len(best)):
            lo = best[i - 1] if i else 0
            hi = best[i + 1] if i + 1 < len(best) else n
            for c in cuts:
                if lo < c < hi and c != best[i]:
                    trial = best[:i] + [c] + best[i + 1:]
                    s = score(trial)
                    if s < best_score:
                        best, best_score, improved = trial, s, True
    return _from_bounds(best, n)


__all__ = ["EXACT_LIMIT", "balance_ranks", "balanced_candidates", "rank_loads", "stage_costs"]
