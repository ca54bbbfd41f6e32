"""Rank-grid tests: pure functions, no process group."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vpp.parallel.grid import AXES, GridSizes, coordinates, global_rank, group_of, rank_groups


@st.composite
def grid_sizes(draw):
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    ep = draw(st.sampled_from([d for d in (1, 2, 4, 8) if tp % d == 0]))
    pp = draw(st.integers(1, 5))
    dp = draw(st.integers(1, 3))
    cp = draw(st.sampled_from([1, 2, 3]))
    return GridSizes(tp * pp * dp * cp, tp=tp, pp=pp, ep=ep, dp=dp, cp=cp)


@settings(max_examples=150, deadline=None)
@given(grid_sizes())
def test_every_rank_in_exactly_one_group_per_axis(sizes):
    groups = rank_groups(sizes)
    expected_size = {"tp": sizes.tp, "pp": sizes.pp, "dp": sizes.dp, "ep": sizes.ep, "etp": sizes.etp,
                     "cp": sizes.cp}
    for axis in AXES:
        members = [r for g in groups[axis] for r in g]
        assert sorted(members) == list(range(sizes.world_size)), axis
        assert all(len(g) == expected_size[axis] for g in groups[axis]), axis


@settings(max_examples=150, deadline=None)
@given(grid_sizes())
def test_groups_are_orthogonal_and_match_coordinates(sizes):
    groups = rank_groups(sizes)
    for rank in range(sizes.world_size):
        tp, pp, dp, cp = (set(group_of(groups, a, rank)) for a in ("tp", "pp", "dp", "cp"))
        # two different axes meet in exactly this rank
        assert tp & pp == {rank} and tp & dp == {rank} and pp & dp == {rank}
        assert cp & tp == {rank} and cp & pp == {rank} and cp & dp == {rank}
        ep, etp = set(group_of(groups, "ep", rank)), set(group_of(groups, "etp", rank))
        assert ep <= tp and etp <= tp and ep & etp == {rank}
        c = coordinates(sizes, rank)
        assert global_rank(sizes, tp=c.tp, pp=c.pp, dp=c.dp, cp=c.cp) == rank
        assert group_of(groups, "cp", rank).index(rank) == c.cp
        # a member's index in each group is its coordinate on that axis
        assert group_of(groups, "tp", rank).index(rank) == c.tp
        assert group_of(groups, "pp", rank).index(rank) == c.pp
        assert group_of(groups, "ep", rank).index(rank) == c.ep
        assert c.tp == c.ep + sizes.ep * c.etp


def test_cp_ranks_are_the_closest_after_tp():
    """Megatron's tp-cp-dp-pp order: a CP group's ranks are one TP group apart, inside a stage."""
    groups = rank_groups(GridSizes(8, tp=2, cp=2, pp=2))
    assert groups["tp"] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert groups["cp"] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert groups["pp"] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert coordinates(GridSizes(8, tp=2, cp=2, pp=2), 6).cp == 1
    assert rank_groups(GridSizes(4, cp=4))["cp"] == [(0, 1, 2, 3)]


def test_layout_is_tp_fastest_then_dp_then_pp():
    groups = rank_groups(GridSizes(8, tp=2, pp=2, dp=2))
    assert groups["tp"] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert groups["dp"] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert groups["pp"] == [(0, 4), (1, 5), (2, 6), (3, 7)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(world_size=6, tp=4, pp=2), "tp=4 * cp=1 * pp=2 * dp=1 = 8 != world_size=6"),
        (dict(world_size=6, tp=2, cp=2), "tp=2 * cp=2 * pp=1 * dp=1 = 4 != world_size=6"),
        (dict(world_size=8, tp=4, pp=2, ep=3), "ep=3 must divide tp=4"),
        (dict(world_size=8, tp=0, pp=2), "tp=0 must be a positive integer"),
        (dict(world_size=8, tp=2, pp=2, dp=1), "tp=2 * cp=1 * pp=2 * dp=1 = 4 != world_size=8"),
    ],
)
def test_bad_sizes_raise_with_the_numbers(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        GridSizes(**kwargs)


def test_coordinates_reject_ranks_outside_the_world():
    with pytest.raises(ValueError, match="global rank 8 outside world_size=8"):
        coordinates(GridSizes(8, tp=8), 8)


def test_all_sizes_small_exhaustive():
    for tp, pp, dp in itertools.product((1, 2, 3), (1, 2, 3), (1, 2)):
        sizes = GridSizes(tp * pp * dp, tp=tp, pp=pp, dp=dp)
        groups = rank_groups(sizes)
        assert len(groups["pp"]) == tp * dp and len(groups["tp"]) == pp * dp


def test_disaggregated_world_splits_into_consecutive_instances():
    from vpp.parallel.instances import disaggregated_sizes, instance_ranks
    prefill, decode = disaggregated_sizes(2, 2, 4, 1)
    assert (prefill.world_size, decode.world_size) == (4, 4)
    assert instance_ranks((prefill, decode)) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert instance_ranks(disaggregated_sizes(1, 3, 2, 2)) == [(0, 1, 2), (3, 4, 5, 6)]
