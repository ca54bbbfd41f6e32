"""Partitions balanced per rank: hand cases, exact optimality on small cases, and the property that the
heaviest rank is never heavier than the per-stage balancer's."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vpp.schedules import balance, balance_ranks, make_layout, rank_loads
from vpp.schedules.layout import stage_ranks_for


def test_v_gives_rank0_fewer_layers_when_it_carries_embedding_and_head():
    """6 equal layers on a V of 2 ranks: rank 0 holds s0 and s3 plus embedding and head (0.6 each). With 3
    layers it would carry 4.2 against rank 1's 3; with 2 layers 3.2 against 4: the heaviest rank is 4."""
    ranks = stage_ranks_for("v", 2)
    part = balance_ranks([1.0] * 6, ranks, embed_cost=0.6, head_cost=0.6)
    assert rank_loads(part, [1.0] * 6, ranks, embed_cost=0.6, head_cost=0.6) == pytest.approx([3.2, 4.0])
    assert part == (1, 2, 2, 1)                     # stages alike: (1.6, 2, 2, 1.6)
    stage = balance([1.0] * 6, 4, embed_cost=0.6, head_cost=0.6)   # the per-stage balancer may leave rank 0 at 4.2
    assert max(rank_loads(stage, [1.0] * 6, ranks, embed_cost=0.6, head_cost=0.6)) >= 4.0


def test_dense_first_layers_and_allowed_starts():
    ranks = stage_ranks_for("loop", 2)
    costs = [0.5, 0.5, 1, 1, 1, 1]                  # two cheap dense layers first
    assert balance_ranks(costs, ranks) == (4, 2)   # 3 vs 2
    assert balance_ranks(costs, ranks, allowed=[0, 3, 5]) == (3, 3)   # cannot cut at 4
    with pytest.raises(ValueError, match="allow 2 stages, 4 asked for"):
        balance_ranks(costs, stage_ranks_for("v", 2), allowed=[0, 3])


def test_near_ties_go_to_even_stages():
    """61 layers, the first 3 (dense) 1% cheaper: moving them to rank 1 lowers the heaviest rank by a hair
    with a lopsided V (1/16/15/29); within the tolerance the even stages win."""
    costs, ranks = [0.99] * 3 + [1.0] * 58, stage_ranks_for("v", 2)
    exact = balance_ranks(costs, ranks, embed_cost=0.05, head_cost=0.05, tolerance=0.0)
    assert max(exact) > 25
    assert max(balance_ranks(costs, ranks, embed_cost=0.05, head_cost=0.05)) == 16


def test_make_layout_per_rank():
    lay = make_layout("v", 61, 2, layer_costs=[1.0] * 61, embed_cost=0.05, head_cost=0.05, per_rank=True)
    loads = rank_loads(lay.partition, [1.0] * 61, lay.stage_ranks, embed_cost=0.05, head_cost=0.05)
    assert loads == pytest.approx([30.1, 31.0])      # rank 0 (embedding, head) takes the 30 layers
    even = make_layout("v", 61, 2).partition
    assert max(loads) < max(rank_loads(even, [1.0] * 61, lay.stage_ranks, embed_cost=0.05, head_cost=0.05))


def _brute_force(costs, ranks, embed, head, allowed=None):
    n, s = len(costs), len(ranks)
    best = None
    for bounds in itertools.combinations(range(1, n) if allowed is None else allowed, s - 1):
        edges = (0, *bounds, n)
        part = [b - a for a, b in zip(edges, edges[1:])]
        top = max(rank_loads(part, costs, ranks, embed_cost=embed, head_cost=head))
        best = top if best is None else min(best, top)
    return best


costs_st = st.lists(st.floats(0.01, 10.0, allow_nan=False), min_size=4, max_size=14)


@settings(max_examples=80, deadline=None)
@given(costs=costs_st, kind=st.sampled_from(["loop", "v", "interleaved"]), pp=st.integers(1, 3),
       embed=st.floats(0, 5), head=st.floats(0, 5))
def test_exact_search_is_optimal_and_never_worse_than_the_stage_balancer(costs, kind, pp, embed, head):
    ranks = stage_ranks_for(kind, pp)
    if len(ranks) > len(costs):
        return
    loads = lambda p: max(rank_loads(p, costs, ranks, embed_cost=embed, head_cost=head))
    optimum = _brute_force(costs, ranks, embed, head)
    exact = balance_ranks(costs, ranks, embed_cost=embed, head_cost=head, tolerance=0.0)
    assert loads(exact) == pytest.approx(optimum, rel=1e-9, abs=1e-12)
    stage = balance(costs, len(ranks), embed_cost=embed, head_cost=head)
    part = balance_ranks(costs, ranks, embed_cost=embed, head_cost=head, seeds=[stage])
    assert sum(part) == len(costs) and min(part) >= 1 and len(part) == len(ranks)
    assert loads(part) <= optimum * (1 + 0.005) * (1 + 1e-9) + 1e-12          # within the tolerance
    assert loads(part) <= loads(stage) * (1 + 1e-9) + 1e-12                   # never worse than per stage


@settings(max_examples=40, deadline=None)
@given(costs=st.lists(st.floats(0.01, 10.0, allow_nan=False), min_size=16, max_size=40),
       kind=st.sampled_from(["v", "interleaved"]), pp=st.integers(2, 4), folds=st.integers(1, 2),
       embed=st.floats(0, 5), head=st.floats(0, 5))
def test_descent_never_worse_than_its_seed(costs, kind, pp, folds, embed, head):
    ranks = stage_ranks_for(kind, pp, folds)
    if len(ranks) > len(costs):
        return
    seed = balance(costs, len(ranks), embed_cost=embed, head_cost=head)
    part = balance_ranks(costs, ranks, embed_cost=embed, head_cost=head, seeds=[seed], exact_limit=0)
    loads = lambda p: rank_loads(p, costs, ranks, embed_cost=embed, head_cost=head)
    assert max(loads(part)) <= max(loads(seed)) * (1 + 1e-9) + 1e-12
    assert sum(part) == len(costs) and min(part) >= 1


@pytest.mark.parametrize("costs, ranks, kw, message", [
    ([1, float("nan"), 1, 1], [0, 1, 1, 0], {}, r"costs must be finite numbers >= 0, got layer cost nan"),
    ([1, float("inf"), 1, 1], [0, 1, 1, 0], {}, r"got layer cost inf"),
    ([1] * 4, [0, 1, 1, 0], dict(embed_cost=float("nan")), r"got embed_cost nan"),
    ([1] * 4, [0, 1, 1, 0], dict(tolerance=-1), r"tolerance=-1 must be a finite number >= 0"),
    ([1, 1], [], {}, r"stage_ranks is empty"),
    ([], [0], {}, r"costs is empty: 1 stages need at least one layer each"),
    ([1] * 4, [0, -1, -1, 0], {}, r"stage_ranks \[0, -1, -1, 0\] must be ranks 0..R-1"),
    ([1] * 4, [0, 3, 3, 0], {}, r"stage_ranks \[0, 3, 3, 0\] must be ranks 0..R-1"),
])
def test_bad_inputs_are_one_line(costs, ranks, kw, message):
    """Before: an IndexError from numpy (NaN costs compare false everywhere), "max() arg is an empty
    sequence", a (0,) partition of no layers, or rank -1 silently folded onto the last rank's load."""
    with pytest.raises(ValueError, match=message):
        balance_ranks(costs, ranks, **kw)


def test_fold_back_heaviest_rank_is_optimal_past_the_exact_limit():
    """A V of 2 ranks over costs 1 5 6 3 7 6 (embedding 2, head 3): stages 1 5 | 6 | 3 7 | 6 cost
    8, 6, 10, 9, so rank 0 carries 8 + 9 = 17 and rank 1 16, the best of the 10 boundary sets. Moving one
    boundary at a time, the search past ``exact_limit`` used to stall at 19 from (1, 1, 2, 2)."""
    costs, ranks = [1, 5, 6, 3, 7, 6], stage_ranks_for("v", 2)
    part = balance_ranks(costs, ranks, embed_cost=2, head_cost=3, exact_limit=0, tolerance=0.0)
    assert max(rank_loads(part, costs, ranks, embed_cost=2, head_cost=3)) == 17 == _brute_force(costs, ranks, 2, 3)


@settings(max_examples=60, deadline=None)
@given(costs=st.lists(st.integers(0, 9), min_size=6, max_size=13), pp=st.integers(1, 3),
       embed=st.integers(0, 4), head=st.integers(0, 4), tolerance=st.sampled_from([0.0, 0.005]),
       data=st.data())
def test_fold_back_search_matches_the_brute_force_at_any_size(costs, pp, embed, head, tolerance, data):
    """``exact_limit=0`` forces the search used for long models (61 layers on P >= 3 has millions of
    boundary sets); on a V of one fold it must still reach the brute-force optimum (within tolerance),
    also with stage starts restricted."""
    ranks = stage_ranks_for("v", pp)
    if len(ranks) > len(costs):
        return
    allowed = sorted(data.draw(st.sets(st.integers(1, len(costs) - 1), min_size=len(ranks) - 1)))
    part = balance_ranks(costs, ranks, embed_cost=embed, head_cost=head, allowed=allowed, exact_limit=0,
                         tolerance=tolerance)
    edges = [0, *itertools.accumulate(part)]
    assert set(edges[1:-1]) <= set(allowed) and min(part) >= 1 and edges[-1] == len(costs)
    best = _brute_force(costs, ranks, embed, head, allowed)
    assert max(rank_loads(part, costs, ranks, embed_cost=embed, head_cost=head)) <= best * (1 + tolerance) + 1e-9
