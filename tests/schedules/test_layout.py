"""Layouts: stage -> rank maps, partitions, balancing and the errors for impossible requests."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vpp.schedules import Layout, balance, make_layout
from vpp.schedules.layout import stage_ranks_for


def test_stage_ranks_of_each_kind():
    assert stage_ranks_for("loop", 4) == (0, 1, 2, 3)
    assert stage_ranks_for("v", 2) == (0, 1, 1, 0)
    assert stage_ranks_for("v", 4) == (0, 1, 2, 3, 3, 2, 1, 0)
    assert stage_ranks_for("v", 2, folds=2) == (0, 1, 1, 0, 0, 1, 1, 0)  # the W
    assert stage_ranks_for("interleaved", 3) == (0, 1, 2, 0, 1, 2)
    assert stage_ranks_for("v", 1) == (0, 0)


def test_v_layout_holds_first_and_last_stage_on_rank0_and_folds_on_the_last_rank():
    lay = make_layout("v", 16, 4)
    assert lay.num_stages == 8 and lay.stages_of(0) == [0, 7] and lay.stages_of(3) == [3, 4]
    assert lay.is_local_hop(3) and not lay.is_local_hop(2) and not lay.is_local_hop(7)
    assert lay.stage_layers[0] == (0, 2) and lay.stage_layers[-1] == (14, 16)
    assert lay.layers_of(5) == range(10, 12) and lay.stage_of_layer(11) == 5


def test_even_split_gives_the_extra_layers_to_the_first_stages():
    assert make_layout("loop", 10, 4).partition == (3, 3, 2, 2)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["loop", "v", "interleaved"]), pp=st.integers(1, 8), folds=st.integers(1, 2),
       extra=st.integers(0, 12), data=st.data())
def test_every_layer_is_on_exactly_one_stage(kind, pp, folds, extra, data):
    folds = 1 if kind == "loop" else folds
    stages = len(stage_ranks_for(kind, pp, folds))
    layers = stages + extra
    cuts = sorted(data.draw(st.lists(st.integers(1, layers - 1), min_size=stages - 1, max_size=stages - 1,
                                     unique=True))) if stages > 1 else []
    bounds = [0] + cuts + [layers]
    partition = [b - a for a, b in zip(bounds, bounds[1:])]
    for lay in (make_layout(kind, layers, pp, folds=folds, partition=partition),
                make_layout(kind, layers, pp, folds=folds)):
        owners = [s for s in range(lay.num_stages) for _ in lay.layers_of(s)]
        assert owners == sorted(owners) and len(owners) == layers  # each layer once, in stage order
        assert [lay.stage_of_layer(i) for i in range(layers)] == owners
        assert lay.layers_of(0)[0] == 0 and lay.layers_of(lay.last_stage)[-1] == layers - 1
        assert sorted(s for r in range(pp) for s in lay.stages_of(r)) == list(range(lay.num_stages))
        assert Layout.from_dict(lay.to_dict()) == lay
    assert make_layout(kind, layers, pp, folds=folds, partition=partition).partition == tuple(partition)


def test_impossible_requests_raise_with_the_numbers():
    with pytest.raises(ValueError, match=r"61 layers cannot fill 8 stages of \[8\]\*8 \(sum 64\)"):
        make_layout("v", 61, 4, partition=[8] * 8)
    with pytest.raises(ValueError, match="num_layers=5 cannot fill 8 virtual stages"):
        make_layout("v", 5, 4)
    with pytest.raises(ValueError, match="num_layers=3 cannot fill 4 virtual stages"):
        make_layout("loop", 3, 4)
    with pytest.raises(ValueError, match=r"partition \[4, 4\] has 2 entries for 4 virtual stages"):
        make_layout("v", 8, 2, partition=[4, 4])
    with pytest.raises(ValueError, match="gives stage 1 0 layers"):
        make_layout("loop", 8, 3, partition=[4, 0, 4])
    with pytest.raises(ValueError, match="folds=2 needs kind 'v' or 'interleaved'"):
        make_layout("loop", 8, 2, folds=2)
    with pytest.raises(ValueError, match="pp=0"):
        make_layout("v", 8, 0)
    with pytest.raises(ValueError, match="unknown layout kind"):
        make_layout("zigzag", 8, 2)
    with pytest.raises(ValueError, match="layer_costs has 3 entries for num_layers=8"):
        make_layout("v", 8, 2, layer_costs=[1, 2, 3])


def test_embedding_and_head_costs_thin_their_stages():
    lay = make_layout("v", 30, 2, embed_cost=3.0, head_cost=3.0)  # rank 0 holds both
    assert lay.partition == (6, 9, 9, 6)
    lay = make_layout("loop", 12, 3, layer_costs=[1] * 8 + [3] * 4)
    assert lay.partition == (7, 3, 2)  # stage costs 7, 7, 6


def _brute(costs, stages, embed, head):
    n, best = len(costs), None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        b = (0,) + cuts + (n,)
        c = [sum(costs[x:y]) + (embed if x == 0 else 0) + (head if y == n else 0) for x, y in zip(b, b[1:])]
        score = (round(max(c), 9), round(sum(v * v for v in c), 9))
        best = min(best, score) if best else score
    return best


@settings(max_examples=40, deadline=None)
@given(costs=st.lists(st.integers(0, 9), min_size=2, max_size=9), data=st.data(),
       embed=st.integers(0, 6), head=st.integers(0, 6))
def test_balance_is_optimal(costs, data, embed, head):
    stages = data.draw(st.integers(1, len(costs)))
    part = balance(costs, stages, embed_cost=embed, head_cost=head)
    assert len(part) == stages and sum(part) == len(costs) and min(part) >= 1
    b = [0]
    for n in part:
        b.append(b[-1] + n)
    c = [sum(costs[x:y]) + (embed if x == 0 else 0) + (head if y == len(costs) else 0) for x, y in zip(b, b[1:])]
    assert (round(max(c), 9), round(sum(v * v for v in c), 9)) == _brute(costs, stages, embed, head)


@pytest.mark.parametrize("args, kw, message", [
    # a huge pp or folds is refused from the counts, before a list of 2 * folds * pp stages is built
    (("v", 8, 10**9), {}, r"num_layers=8 cannot fill 2000000000 virtual stages \(v layout, pp=1000000000"),
    (("v", 8, 2), dict(folds=10**9), r"num_layers=8 cannot fill 4000000000 virtual stages"),
    (("v", "8", 2), {}, r"num_layers='8' must be an integer, got str"),
    (("v", 4.5, 2), {}, r"num_layers=4.5 must be an integer, got float"),
    (("v", 8, None), {}, r"pp=None must be an integer, got NoneType"),
    (("loop", 8, 2.0), {}, r"pp=2.0 must be an integer, got float"),
    (("v", 8, 2), dict(folds=1.5), r"folds=1.5 must be an integer, got float"),
    (("v", 8, 2), dict(partition=[2.5, 1.5, 2, 2]), r"partition \[2.5, 1.5, 2, 2\] must hold integer layer counts"),
    (("v", 8, 2), dict(layer_costs=[1, float("nan")] + [1] * 6),
     r"layer_costs must be finite and >= 0, got nan for layer 1"),
    (("v", 8, 2), dict(layer_costs=float("inf")), r"layer_costs must be finite and >= 0, got inf for layer 0"),
    (("v", 8, 2), dict(layer_costs="abc"), r"layer_costs must be a number or one number per layer, got 'abc'"),
    (("v", 8, 2), dict(embed_cost=float("nan")), r"embed_cost=nan: costs must be finite numbers >= 0"),
    (("v", 8, 2), dict(head_cost=float("inf"), per_rank=True), r"head_cost=inf: costs must be finite numbers >= 0"),
])
def test_bad_arguments_name_themselves_before_any_work(args, kw, message):
    """Each used to fail deep inside (a TypeError without the argument, "stage 0 holds layers [0, 0)"
    for a NaN cost, or an out-of-memory kill building 2e9 stage ranks for pp=10**9)."""
    with pytest.raises(ValueError, match=message):
        make_layout(*args, **kw)


@pytest.mark.parametrize("pp", range(1, 9))
@pytest.mark.parametrize("folds", [1, 2, 3])
def test_fold_back_map_and_even_split_for_every_layer_count(pp, folds):
    """The V: lap j of P stages walks the ranks up (j even) or down (j odd); with one fold stage i sits on
    rank i for i < P and on rank 2P-1-i after. Every L from 2fP to 130 (primes, DeepSeek's 61): each
    layer once, in order; stages differ by at most one layer, the extra layers on the first stages (the
    promise of ``make_layout``); and so do ranks, since the first L mod 2fP stages are whole laps (one
    stage per rank each) and then a run of distinct ranks."""
    stages = 2 * folds * pp
    ranks = [i % pp if (i // pp) % 2 == 0 else pp - 1 - i % pp for i in range(stages)]
    if folds == 1:
        assert ranks == [i if i < pp else 2 * pp - 1 - i for i in range(stages)]
    for num_layers in range(stages, 131):
        lay = make_layout("v", num_layers, pp, folds=folds)
        assert list(lay.stage_ranks) == ranks
        assert [i for s in range(stages) for i in lay.layers_of(s)] == list(range(num_layers))
        base, extra = divmod(num_layers, stages)
        assert lay.partition == tuple(base + (s < extra) for s in range(stages))
        per_rank = [sum(lay.partition[s] for s in lay.stages_of(r)) for r in range(pp)]
        assert max(per_rank) - min(per_rank) <= 1
        assert [s for s in range(stages - 1) if lay.is_local_hop(s)] == [s for s in range(stages - 1)
                                                                      if ranks[s] == ranks[s + 1]]


def test_allowed_starts_are_honoured_or_refused_by_every_partition():
    """GLM-5's shared-indexer layers cannot start a stage. ``allowed_starts`` used to bind only the
    per-rank balancer: a given partition or the even split that cut at layer 4 came back silently."""
    lay = make_layout("v", 8, 2, partition=[3, 2, 1, 2], allowed_starts=[0, 3, 5, 6])
    assert [a for a, _ in lay.stage_layers] == [0, 3, 5, 6]
    with pytest.raises(ValueError, match=r"partition \[2, 2, 2, 2\] starts stage 1 at layer 2, not one of the "
                                         r"allowed_starts \[0, 3, 5, 6\] \(v layout, pp=2, folds=1\)$"):
        make_layout("v", 8, 2, partition=[2, 2, 2, 2], allowed_starts=[3, 5, 6])
    with pytest.raises(ValueError, match="starts stage 1 at layer 2.*; pass per_rank=True to cut only there"):
        make_layout("v", 8, 2, allowed_starts=[0, 3, 5, 6])
    balanced = make_layout("v", 8, 2, allowed_starts=[0, 3, 5, 6], per_rank=True)
    assert [a for a, _ in balanced.stage_layers] == [0, 3, 5, 6]
