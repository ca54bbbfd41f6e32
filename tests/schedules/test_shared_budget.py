"""One token budget shared by a stream's requests: steps filled as vLLM's scheduler fills a batch
(checked by hand), DCPP's shared time budget, and plans of such chunks verify and simulate."""

import pytest

from vpp.schedules import build_cpp, make_layout, simulate_plan, verify
from vpp.schedules.cost import LinearCost
from vpp.schedules.dcpp import DcppPlanner
from vpp.schedules.shared_budget import shared_budget_requests, shared_budget_steps


def test_steps_by_hand():
    # budget 512: r0 takes a full step, its 488 left share the next with 24 of r1, whose 276 left share
    # one with 236 of r2; r2's 4764 left are 9 full steps and 156.
    steps = shared_budget_steps([1000, 300, 5000], 512)
    assert steps[:3] == [[(0, 512)], [(0, 488), (1, 24)], [(1, 276), (2, 236)]]
    assert steps[3:] == [[(2, 512)]] * 9 + [[(2, 156)]]
    reqs = shared_budget_requests([1000, 300, 5000], 512)
    assert [q.chunk_sizes for q in reqs] == [(512, 488), (24, 276), (236,) + (512,) * 9 + (156,)]
    assert all(sum(n for _, n in s) <= 512 for s in steps)


def test_short_requests_share_one_step():
    assert shared_budget_steps([100, 200, 150, 300], 512) == [[(0, 100), (1, 200), (2, 150), (3, 62)], [(3, 238)]]


def test_dcpp_shares_the_time_budget():
    f = lambda n: 1e-3 + 1e-6 * n + 1e-10 * n * n
    p = DcppPlanner("vllm-ascend", budget=8192, min_chunk=512, online=False).profile(f)
    steps = shared_budget_steps([20000, 3000], 8192, planner=p)
    for step in steps:
        assert sum(n for _, n in step) <= 8192
    # the step where r0 ends also carries r1, sized for the time r0's tail left over
    mixed = next(s for s in steps if len(s) == 2)
    (q0, tail), (q1, head) = mixed
    prefix = 20000 - tail
    left = p.target - p.time(tail, prefix) * 1000.0
    assert (q0, q1) == (0, 1) and head == min(p.next_chunk(0, 3000, first=True, time_budget_ms=left), 8192 - tail)


@pytest.mark.parametrize("lengths", [[1000, 300, 5000], [100, 200, 150, 300]])
def test_shared_budget_plans_verify_and_simulate(lengths):
    layout = make_layout("loop", 8, 2)
    cost = LinearCost(per_chunk=1e-3, per_token=1e-5, per_token_prefix=1e-8, stage_weights=(1.0, 1.0))
    plan = verify(build_cpp(layout, shared_budget_requests(lengths, 512)))
    s = simulate_plan(plan, cost).summarize()
    assert s.makespan > 0 and sum(q.new_tokens for q in plan.requests) == sum(lengths)


def test_on_step_sees_each_step_with_its_prefixes():
    seen = []
    steps = shared_budget_steps([1000, 300, 5000], 512, on_step=seen.append)
    assert len(seen) == len(steps)
    assert seen[:3] == [[(512, 0)], [(488, 512), (24, 0)], [(276, 24), (236, 0)]]
    assert seen[3] == [(512, 236)]
