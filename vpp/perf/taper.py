"""Head/tail taper: a VPP chunk planner for chunk times with a large intercept.

Eq. 3b balances the V for any chunk time that is affine in the chunk index, tau_k = alpha + beta k, so a
V's remaining bubble is its fill (about tau_0) and drain (about the last chunk's tau). Under the paper's
Eq. 2 (alpha = beta) the first chunk is cheap. Sparse attention (DSA), GQA with light attention, or any
layer with a big per-token constant make alpha many times beta: the fill and drain then cost whole
chunk times. Cutting the first and last budgets into a short ramp of smaller chunks (fractions of the
budget, e.g. 1/4, 1/4, 1/2 ... 1/2, 1/4, 1/4) restores a cheap fill and drain at the price of a few more
chunks; the paper's "24K tail effect" (a ragged last chunk shortens the drain) is the tail half of this.
Which ramp pays depends on the per-chunk costs (MLA's prefix rebuild taxes every extra chunk), so the
planner tries a small family and keeps the best by simulation.
"""

from __future__ import annotations

from typing import Callable, Sequence

HEADS: tuple[tuple[float, ...], ...] = ((), (0.5, 0.5), (0.25, 0.75), (0.25, 0.25, 0.5), (0.125, 0.125, 0.25, 0.5))
TAILS: tuple[tuple[float, ...], ...] = ((), (0.5, 0.5), (0.75, 0.25), (0.5, 0.25, 0.25))
ALIGN = 64


def tapered_sizes(length: int, budget: int, head: Sequence[float] = (), tail: Sequence[float] = ()) -> list[int]:
    """Chunk sizes: the ``head`` fractions of the budget, full budgets, a ragged remainder, then the
    ``tail`` fractions (rounded to 64 tokens). Falls back to plain budgets when the ramps do not fit."""
    if length < 1 or budget < 1:
        raise ValueError(f"length={length}, budget={budget}: both must be >= 1")
    frac = lambda f: max(ALIGN, int(budget * f) // ALIGN * ALIGN)
    h, t = [frac(f) for f in head], [frac(f) for f in tail]
    mid = length - sum(h) - sum(t)
    if mid < 0:
        h, t, mid = [], [], length
    full, rest = divmod(mid, budget)
    return h + [budget] * full + ([rest] if rest else []) + t


def tapered_chunking(budget: int, head: Sequence[float] = (), tail: Sequence[float] = ()):
    """A chunking function (the runtime's ``chunk_size``: prompt tokens -> chunk sizes) cutting every
    prompt as :func:`tapered_sizes` does; after ``cached`` tokens the rest is cut the same way."""
    head, tail = tuple(head), tuple(tail)

    def tapered(n: int, cached: int = 0) -> list[int]:
        return tapered_sizes(n, budget, head, tail)
    return tapered


def best_taper(evaluate: Callable[[list[int]], float], length: int, budget: int, *,
               heads=HEADS, tails=TAILS) -> tuple[list[int], tuple, tuple, float]:
    """The (sizes, head, tail, score) with the lowest ``evaluate(sizes)`` over the ramp family."""
    best = None
    seen = set()
    for head in heads:
        for tail in tails:
            sizes = tapered_sizes(length, budget, head, tail)
            key = tuple(sizes)
            if key in seen:
                continue
            seen.add(key)
            score = evaluate(sizes)
            if best is None or score < best[3]:
                best = (sizes, head, tail, score)
    return best


__all__ = ["ALIGN", "HEADS", "TAILS", "best_taper", "tapered_chunking", "tapered_sizes"]
