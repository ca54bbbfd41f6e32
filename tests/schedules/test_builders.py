"""Plan builders: properties over layouts and request mixes, and the shape of the VPP orders."""


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vpp.schedules import (COMPUTE, HANDOFF, RECV, LinearCost, Request, Task, build_cpp, build_plan,
                           build_vpp, build_vpp_async, chunk_requests, link_group, make_layout,
                           plan_from_orders, simulate_plan, verify)
from vpp.schedules.order import list_schedule, slot_key

from tests.schedules.checks import check_runs_everything_once


@st.composite
def request_mixes(draw):
    ids = draw(st.lists(st.integers(0, 50), min_size=1, max_size=3, unique=True))
    return [Request(i, tuple(draw(st.lists(st.integers(1, 64), min_size=1, max_size=4)))) for i in ids]


@st.composite
def layouts(draw):
    kind = draw(st.sampled_from(["loop", "v", "interleaved"]))
    pp = draw(st.integers(1, 8))
    folds = 1 if kind == "loop" else draw(st.integers(1, 2))
    stages = pp * (1 if kind == "loop" else 2 * folds)
    return make_layout(kind, stages + draw(st.integers(0, 3)), pp, folds=folds)


def check_requests_in_order(plan):
    """On every stage, chunks run in order and requests one after another, in the order given."""
    order = [(q.id, c) for q in plan.requests for c in range(q.num_chunks)]
    for acts in plan.actions:
        for s in {a.stage for a in acts if a.op == COMPUTE}:
            seen = [(a.request, a.chunk) for a in acts if a.op == COMPUTE and a.stage == s]
            assert seen == order


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts(), requests=request_mixes(), comm=st.sampled_from(["blocking", "async"]))
def test_every_plan_verifies_and_runs_every_action_once(layout, requests, comm):
    plans = [build_vpp(layout, requests, comm=comm), build_vpp_async(layout, requests)]
    if layout.kind == "loop":
        plans.append(build_cpp(layout, requests, comm=comm))
    for plan in plans:
        verify(plan)
        if plan.comm == "async":
            verify(plan, semantics="serial")
        check_runs_everything_once(plan)
        check_requests_in_order(plan)
        trace = simulate_plan(plan, LinearCost(per_chunk=1.0, per_token=0.01, per_token_prefix=1e-4, latency=0.3,
                                          overlap=0.5), check=False)
        assert len(trace.of(kind="compute")) == sum(q.num_chunks for q in requests) * layout.num_stages


def computes(plan, rank):
    return [f"s{a.stage}/C{a.chunk}" for a in plan.computes(rank)]


def test_vpp_follows_algorithm_1_on_two_ranks():
    plan = build_vpp(make_layout("v", 8, 2), chunk_requests([6], 1))
    assert computes(plan, 0) == ["s0/C0", "s0/C1", "s3/C0", "s0/C2", "s3/C1", "s0/C3", "s3/C2", "s0/C4",
                                 "s3/C3", "s0/C5", "s3/C4", "s3/C5"]
    assert computes(plan, 1)[:6] == ["s1/C0", "s2/C0", "s1/C1", "s2/C1", "s1/C2", "s2/C2"]
    # At each chunk boundary rank 0 sends s0's output first, then receives s2's; rank 1 the reverse.
    text = [str(a) for a in plan.actions[0]]
    assert text[2:6] == ["F0.r0.c1", "S0>1.r0.c1", "R2<1.r0.c0", "F3.r0.c0"]
    text = [str(a) for a in plan.actions[1]]
    assert text[3:7] == ["F2.r0.c0", "R0<0.r0.c1", "S2>0.r0.c0", "F1.r0.c1"]


def test_vpp_async_swaps_exit_and_entry_stage_on_rank0():
    plan = build_vpp_async(make_layout("v", 8, 2), chunk_requests([6], 1))
    assert computes(plan, 0) == ["s0/C0", "s0/C1", "s0/C2", "s3/C0", "s0/C3", "s3/C1", "s0/C4", "s3/C2",
                                 "s0/C5", "s3/C3", "s3/C4", "s3/C5"]
    assert plan.comm == "async"
    # In the steady state every receive is posted one compute ahead of its consumer.
    for acts in plan.actions:
        for i, a in enumerate(acts):
            if a.op == RECV and 0 < a.chunk < 4:
                between = [b for b in acts[i + 1:] if b.op == COMPUTE]
                consumer = next(k for k, b in enumerate(between) if b.key == (a.stage + 1, a.request, a.chunk))
                assert consumer >= 1, f"{a} posted right before its consumer"


def test_fold_point_hands_over_locally():
    plan = build_vpp(make_layout("v", 16, 4), chunk_requests([10], 4))
    assert not [a for acts in plan.actions for a in acts if a.is_comm and a.stage == 3]
    assert [str(a) for a in plan.actions[3] if a.op == HANDOFF] == ["L3.r0.c0", "L3.r0.c1", "L3.r0.c2"]


def test_cpp_needs_a_loop_layout_and_takes_variable_chunks():
    with pytest.raises(ValueError, match="build_cpp runs a loop layout"):
        build_cpp(make_layout("v", 8, 2), chunk_requests([8], 2))
    requests = [Request(0, (8, 6, 4, 3, 2)), Request(1, (5,))]  # as a DCPP planner would shrink them
    plan = verify(build_cpp(make_layout("loop", 6, 3), requests))
    assert plan.requests == tuple(requests)
    assert [str(a) for a in plan.computes(2)] == [f"F2.r0.c{c}" for c in range(5)] + ["F2.r1.c0"]


def test_custom_keys_and_orders_reuse_the_passes():
    layout, requests = make_layout("v", 8, 2), chunk_requests([4, 2], 1)
    # A packing-style key: request 1's first chunk enters the pipeline as early as possible.
    base = slot_key(layout, requests)
    packed = build_plan(layout, requests, key=lambda t: base(t) if t.request == 0 else (base(t)[0] - 4, t.stage))
    verify(packed)
    assert computes(packed, 0).index("s0/C0") < 8
    orders, starts = list_schedule(layout, requests, base)
    assert verify(plan_from_orders(layout, requests, orders)).computes(0) == \
        verify(plan_from_orders(layout, requests, orders, starts=starts)).computes(0)
    backwards = [list(reversed(o)) for o in orders]
    with pytest.raises(ValueError, match="cannot run together"):
        plan_from_orders(layout, requests, backwards)
    with pytest.raises(ValueError, match="misses"):
        plan_from_orders(layout, requests, [orders[0][1:], orders[1]])
    assert orders[0][0] == Task(0, 0, 0)


def test_link_groups_split_directions():
    assert link_group(0, 1) == 0 and link_group(1, 0) == 1 and link_group(3, 7) == 0
