"""Layouts: which layers form each virtual stage, and which rank holds each stage.

Kinds (``P`` ranks, ``f`` folds):

* ``"loop"``        -- plain CPP: ``P`` stages, stage ``i`` on rank ``i``. ``f`` must be 1.
* ``"v"``           -- the paper's fold-back: ``2fP`` stages in ``2f`` laps of ``P``; even laps walk the
  ranks ``0 .. P-1``, odd laps walk back ``P-1 .. 0``. With ``f = 1`` stage ``i`` is on rank ``i`` for
  ``i < P`` and on rank ``2P-1-i`` after: rank 0 holds the first and the last stage, rank ``P-1`` is the
  fold point. ``f = 2`` is the W (down, up, down, up), and so on.
* ``"interleaved"`` -- Megatron-style: ``2fP`` stages, stage ``i`` on rank ``i mod P`` (the same stage
  count and partition as a V with the same ``f``, so the two can be compared on the same work).

Stage 0 holds layer 0 and the embedding; the last stage holds the last layer, the final norm and the
LM head. ``stage_layers[s]`` is the half-open global layer range ``[start, end)`` of stage ``s``;
every stage holds at least one layer.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

from .rank_balance import balance_ranks

KINDS = ("loop", "v", "interleaved")


@dataclass(frozen=True)
class Layout:
    """Stage -> rank and stage -> layer range of a pipeline of ``num_ranks`` ranks."""

    kind: str
    num_ranks: int
    num_layers: int
    folds: int
    stage_ranks: tuple[int, ...]
    stage_layers: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage_ranks", tuple(int(r) for r in self.stage_ranks))
        object.__setattr__(self, "stage_layers", tuple((int(a), int(b)) for a, b in self.stage_layers))
        if len(self.stage_ranks) != len(self.stage_layers):
            raise ValueError(f"{len(self.stage_ranks)} stage ranks but {len(self.stage_layers)} stage layer ranges")
        bad = [r for r in self.stage_ranks if not 0 <= r < self.num_ranks]
        if bad:
            raise ValueError(f"stage ranks {bad} outside 0..{self.num_ranks - 1}")
        idle = sorted(set(range(self.num_ranks)) - set(self.stage_ranks))
        if idle:
            raise ValueError(f"ranks {idle} hold no stage in {list(self.stage_ranks)}")
        start = 0
        for s, (a, b) in enumerate(self.stage_layers):
            if a != start or b <= a:
                raise ValueError(f"stage {s} holds layers [{a}, {b}); expected a non-empty range from {start}")
            start = b
        if start != self.num_layers:
            raise ValueError(f"stages cover layers [0, {start}) but num_layers={self.num_layers}")

    @property
    def num_stages(self) -> int:
        return len(self.stage_ranks)

    @property
    def last_stage(self) -> int:
        return self.num_stages - 1

    @property
    def partition(self) -> tuple[int, ...]:
        """Layers per stage."""
        return tuple(b - a for a, b in self.stage_layers)

    def stages_of(self, rank: int) -> list[int]:
        """The stages held by ``rank``, in pipeline order."""
        return [s for s, r in enumerate(self.stage_ranks) if r == rank]

    def rank_of(self, stage: int) -> int:
        return self.stage_ranks[stage]

    def layers_of(self, stage: int) -> range:
        a, b = self.stage_layers[stage]
        return range(a, b)

    def stage_of_layer(self, layer: int) -> int:
        for s, (a, b) in enumerate(self.stage_layers):
            if a <= layer < b:
                return s
        raise ValueError(f"layer {layer} outside 0..{self.num_layers - 1}")

    def is_local_hop(self, stage: int) -> bool:
        """True if ``stage``'s output feeds ``stage + 1`` on the same rank (a local hand-off)."""
        return stage < self.last_stage and self.stage_ranks[stage] == self.stage_ranks[stage + 1]

    def describe(self) -> str:
        return (f"{self.kind} layout, pp={self.num_ranks}, folds={self.folds}: stage->rank "
                f"{list(self.stage_ranks)}, layers per stage {_fmt_partition(self.partition)}")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "num_ranks": self.num_ranks, "num_layers": self.num_layers,
                "folds": self.folds, "stage_ranks": list(self.stage_ranks),
                "stage_layers": [list(r) for r in self.stage_layers]}

    @classmethod
    def from_dict(cls, d: dict) -> "Layout":
        return cls(kind=d["kind"], num_ranks=d["num_ranks"], num_layers=d["num_layers"], folds=d["folds"],
                   stage_ranks=tuple(d["stage_ranks"]), stage_layers=tuple(tuple(r) for r in d["stage_layers"]))


def _check_count(name: str, value) -> None:
    """An integer (Python or numpy; not a bool, not a float) >= 1, or one line naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}={value!r} must be an integer, got {type(value).__name__}")


def stage_ranks_for(kind: str, pp: int, folds: int = 1) -> tuple[int, ...]:
    """The stage -> rank map of a layout kind (see the module docstring)."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"unknown layout kind {kind!r}; choose one of {KINDS}")
    _check_count("pp", pp)
    _check_count("folds", folds)
    if pp < 1:
        raise ValueError(f"pp={pp}: a pipeline needs at least one rank")
    if folds < 1:
        raise ValueError(f"folds={folds}: need at least one fold")
    if kind == "loop":
        if folds != 1:
            raise ValueError(f"the loop layout has one stage per rank; folds={folds} needs kind 'v' or 'interleaved'")
        return tuple(range(pp))
    stages = 2 * folds * pp
    if kind == "interleaved":
        return tuple(i % pp for i in range(stages))
    return tuple(i % pp if (i // pp) % 2 == 0 else pp - 1 - i % pp for i in range(stages))


def make_layout(kind: str, num_layers: int, pp: int, *, folds: int = 1,
                partition: Sequence[int] | None = None,
                layer_costs: Sequence[float] | float | None = None,
                embed_cost: float = 0.0, head_cost: float = 0.0, per_rank: bool = False,
                allowed_starts: Sequence[int] | None = None) -> Layout:
    """Build a layout of ``num_layers`` layers on ``pp`` ranks.

    ``partition`` gives the layers of each stage explicitly. Otherwise, without costs, layers are split
    evenly (the first ``num_layers % num_stages`` stages get one more). With ``layer_costs`` (one per
    layer, or one number for all) or a non-zero ``embed_cost`` / ``head_cost`` (charged to the first /
    last stage; in a V both land on rank 0), the partition minimises the most expensive stage and,
    among those, the spread of stage costs (sum of squares); with ``per_rank`` it minimises the most
    expensive *rank* instead (:func:`.rank_balance.balance_ranks`), cutting stages only at
    ``allowed_starts`` when given. Any other partition (given, even or per stage) that starts a stage
    elsewhere than ``allowed_starts`` is refused.
    """
    _check_count("num_layers", num_layers)
    if isinstance(kind, str) and kind in KINDS and all(  # before any list of stages is built (pp=10**9)
            isinstance(x, numbers.Integral) and not isinstance(x, bool) and x >= 1 for x in (pp, folds)):
        stages = pp if kind == "loop" else 2 * folds * pp
        if num_layers < stages:
            raise ValueError(f"num_layers={num_layers} cannot fill {stages} virtual stages ({kind} layout, pp={pp}, "
                             f"folds={folds}): every stage needs at least one layer")
    ranks = stage_ranks_for(kind, pp, folds)
    where = f"{kind} layout, pp={pp}, folds={folds}"
    given = partition is not None
    if per_rank and partition is None:
        costs = _layer_costs(num_layers, layer_costs)
        _check_edge_costs(embed_cost, head_cost)
        seeds = [] if allowed_starts is not None else [balance(costs, len(ranks), embed_cost=embed_cost,
                                                               head_cost=head_cost)]
        partition = balance_ranks(costs, ranks, embed_cost=embed_cost, head_cost=head_cost,
                                  allowed=allowed_starts, seeds=seeds)
    counts = _partition(num_layers, len(ranks), partition, layer_costs, embed_cost, head_cost, where)
    bounds, start = [], 0
    for n in counts:
        bounds.append((start, start + n))
        start += n
    if allowed_starts is not None:
        allowed = sorted({0, *(int(a) for a in allowed_starts)})
        off = next(((s, a) for s, (a, _) in enumerate(bounds) if a not in allowed), None)
        if off is not None:
            hint = "" if given or per_rank else "; pass per_rank=True to cut only there"
            raise ValueError(f"partition {list(counts)} starts stage {off[0]} at layer {off[1]}, not one of the "
                             f"allowed_starts {allowed} ({where}){hint}")
    return Layout(kind=kind, num_ranks=pp, num_layers=num_layers, folds=folds,
                  stage_ranks=ranks, stage_layers=tuple(bounds))


def _fmt_partition(p: Sequence[int]) -> str:
    p = list(p)
    if len(p) > 1 and len(set(p)) == 1:
        return f"[{p[0]}]*{len(p)}"
    return str(p)


def _partition(num_layers: int, stages: int, partition, layer_costs, embed_cost, head_cost,
               where: str) -> tuple[int, ...]:
    if num_layers < stages:
        raise ValueError(f"num_layers={num_layers} cannot fill {stages} virtual stages ({where}): "
                         f"every stage needs at least one layer")
    if partition is not None:
        bad = [n for n in partition if isinstance(n, bool) or not isinstance(n, numbers.Integral)]
        if bad:
            raise ValueError(f"partition {list(partition)} must hold integer layer counts ({where})")
        p = [int(n) for n in partition]
        if len(p) != stages:
            raise ValueError(f"partition {p} has {len(p)} entries for {stages} virtual stages ({where})")
        if sum(p) != num_layers:
            raise ValueError(f"{num_layers} layers cannot fill {stages} stages of {_fmt_partition(p)} "
                             f"(sum {sum(p)}) ({where})")
        low = [(s, n) for s, n in enumerate(p) if n < 1]
        if low:
            raise ValueError(f"partition {p} gives stage {low[0][0]} {low[0][1]} layers ({where}); "
                             f"every stage needs at least one")
        return tuple(p)
    if layer_costs is None and embed_cost == 0 and head_cost == 0:
        base, extra = divmod(num_layers, stages)
        return tuple(base + (1 if s < extra else 0) for s in range(stages))
    costs = _layer_costs(num_layers, layer_costs)
    _check_edge_costs(embed_cost, head_cost)
    return balance(costs, stages, embed_cost=embed_cost, head_cost=head_cost)


def _check_edge_costs(embed_cost, head_cost) -> None:
    for name, c in (("embed_cost", embed_cost), ("head_cost", head_cost)):
        if isinstance(c, bool) or not isinstance(c, numbers.Real) or not (0 <= c < math.inf):
            raise ValueError(f"{name}={c!r}: costs must be finite numbers >= 0")


def _layer_costs(num_layers: int, layer_costs) -> list[float]:
    if layer_costs is None:
        return [1.0] * num_layers
    if isinstance(layer_costs, numbers.Real) and not isinstance(layer_costs, bool):
        layer_costs = [layer_costs] * num_layers
    if isinstance(layer_costs, (str, bytes)) or not isinstance(layer_costs, Sequence) or any(
            isinstance(c, bool) or not isinstance(c, numbers.Real) for c in layer_costs):
        raise ValueError(f"layer_costs must be a number or one number per layer, got {layer_costs!r:.80}")
    costs = [float(c) for c in layer_costs]
    if len(costs) != num_layers:
        raise ValueError(f"layer_costs has {len(costs)} entries for num_layers={num_layers}")
    bad = [(i, c) for i, c in enumerate(costs) if not 0 <= c < math.inf]
    if bad:
        raise ValueError(f"layer_costs must be finite and >= 0, got {bad[0][1]} for layer {bad[0][0]}")
    return costs


def balance(costs: Sequence[float], stages: int, *, embed_cost: float = 0.0,
            head_cost: float = 0.0) -> tuple[int, ...]:
    """Contiguous partition of ``costs`` into ``stages`` non-empty stages.

    Minimises the largest stage cost (embedding cost on stage 0, head cost on the last), then, among
    partitions reaching that bound, the sum of squared stage costs. Exact: a bound search over the
    candidate stage costs, then a dynamic programme over stage ends (O(stages * layers^2)).
    """
    n = len(costs)
    if n < stages:
        raise ValueError(f"num_layers={n} cannot fill {stages} stages: every stage needs at least one layer")
    pre = [0.0]
    for c in costs:
        pre.append(pre[-1] + c)

    def cost(a: int, b: int) -> float:
        return pre[b] - pre[a] + (embed_cost if a == 0 else 0.0) + (head_cost if b == n else 0.0)

    candidates = sorted({cost(a, b) for a in range(n) for b in range(a + 1, n + 1)})
    lo, hi = 0, len(candidates) - 1
    while lo < hi:  # smallest bound that admits a partition
        mid = (lo + hi) // 2
        if _fits(cost, n, stages, candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    bound = candidates[lo] * (1 + 1e-12) + 1e-15
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    back = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for b in range(s, n - (stages - s) + 1):
            for a in range(s - 1, b):
                if best[s - 1][a] == inf:
                    continue
                c = cost(a, b)
                if c <= bound and best[s - 1][a] + c * c < best[s][b]:
                    best[s][b], back[s][b] = best[s - 1][a] + c * c, a
    out, b = [], n
    for s in range(stages, 0, -1):
        a = back[s][b]
        out.append(b - a)
        b = a
    return tuple(reversed(out))


def _fits(cost, n: int, stages: int, bound: float) -> bool:
    """Can ``n`` layers be cut into at most ``stages`` stages each costing <= bound? (greedy)"""
    used, a = 0, 0
    while a < n:
        b = a + 1
        if cost(a, b) > bound:
            return False
        while b < n and cost(a, b + 1) <= bound:
            b += 1
        used, a = used + 1, b
    return used <= stages


__all__ = ["KINDS", "Layout", "balance", "make_layout", "stage_ranks_for"]
