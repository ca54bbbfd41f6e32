"""Steps shared by several requests (``Plan.steps``): the IR prints and parses them, the verifier
checks their rules, every builder emits them, and the simulator charges a step's per-step overhead and
its transfer once, checked against closed-form makespans."""

import pytest

from vpp.schedules import build_cpp, build_vpp, build_vpp_async, chunk_requests, make_layout, simulate_plan, verify
from vpp.schedules.cost import FlopCost, LinearCost, step_overhead
from vpp.schedules.ir import Plan, Request, replace_actions
from vpp.schedules.shared_budget import shared_budget_requests, shared_budget_stream
from vpp.schedules.verify import PlanError


def _stream(lengths, budget):
    return shared_budget_stream(lengths, budget)


def test_stream_steps_name_each_requests_pieces_in_order():
    requests, steps = _stream([1000, 300, 5000], 512)
    assert [q.chunk_sizes for q in requests] == [q.chunk_sizes for q in shared_budget_requests([1000, 300, 5000], 512)]
    assert steps[:3] == [[(0, 0)], [(0, 1), (1, 0)], [(1, 1), (2, 0)]]
    assert len(steps) == 3 + 10


@pytest.mark.parametrize("builder,kind", [(build_cpp, "loop"), (build_vpp, "v"), (build_vpp_async, "v")])
def test_builders_emit_one_transfer_per_step(builder, kind):
    layout = make_layout(kind, 8, 2)
    requests, steps = _stream([100, 200, 150, 300, 700], 256)
    plan = verify(builder(layout, requests, steps=steps))
    shared = [g for g in steps if len(g) > 1]
    assert [list(g) for g in plan.steps] == shared
    sends = [a for acts in plan.actions for a in acts if a.op == "S"]
    remote_hops = sum(not layout.is_local_hop(s) for s in range(layout.num_stages - 1))
    assert len(sends) == len(steps) * remote_hops  # one message per step and hop, not per piece
    pieces = sum(q.num_chunks for q in requests)
    assert sum(len(plan.computes(r)) for r in range(layout.num_ranks)) == pieces * layout.num_stages


def test_steps_print_and_parse_back_and_plain_plans_are_unchanged():
    layout = make_layout("loop", 4, 2)
    requests, steps = _stream([100, 200, 150], 256)
    plan = build_cpp(layout, requests, steps=steps)
    d = plan.to_dict()
    assert d["steps"] == [["r0.c0", "r1.c0"], ["r1.c1", "r2.c0"]]
    assert Plan.from_json(plan.to_json()) == plan
    plain = build_cpp(layout, chunk_requests([100, 200], 64))
    assert "steps" not in plain.to_dict() and plain.steps == ()


def test_verifier_rules_for_shared_steps():
    layout = make_layout("loop", 4, 2)
    requests, steps = _stream([100, 200], 256)
    plan = build_cpp(layout, requests, steps=steps)
    acts = [list(a) for a in plan.actions]
    # the pieces of a step not back to back on rank 1
    r1 = acts[1]
    i = next(k for k, a in enumerate(r1) if a.op == "F" and a.request == 1)
    assert r1[i + 1].op == "R"  # the next step's receive, moved in between the pieces of this one
    moved = r1[:i] + [r1[i + 1], r1[i]] + r1[i + 2:]
    with pytest.raises(PlanError, match="back to back"):
        verify(replace_actions(plan, [acts[0], moved]))
    # a step's second piece may not send on its own
    with pytest.raises(PlanError, match="missing|shares the step"):
        verify(replace_actions(plan, plan.actions, steps=()))
    with pytest.raises(ValueError, match="in steps 0 and 1"):
        replace_actions(plan, plan.actions, steps=(((0, 0), (1, 0)), ((1, 0), (0, 1))))


def test_cpp_shared_budget_stream_closed_form():
    """n short requests of m tokens, budget k m, CPP on P ranks, free transfers, stage time o + a x for x
    tokens. One request per step: n uniform chunks through P stages, makespan (n + P - 1)(o + a m).
    Shared steps: n / k steps of k m tokens whose overhead is paid once, (n / k + P - 1)(o + a k m). The
    gain is (n - n/k) o - (P - 1)(k - 1) a m: the overhead of every piece but one per step, less the
    longer fill and drain of bigger steps."""
    P, n, m, k, o, a = 2, 16, 100, 4, 1.0, 0.01
    layout = make_layout("loop", P, P)
    cost = LinearCost(per_chunk=o, per_token=a)
    single = simulate_plan(build_cpp(layout, chunk_requests([m] * n, m)), cost).makespan
    requests, steps = shared_budget_stream([m] * n, k * m)
    shared = simulate_plan(build_cpp(layout, requests, steps=steps), cost).makespan
    assert single == pytest.approx((n + P - 1) * (o + a * m))
    assert shared == pytest.approx((n // k + P - 1) * (o + a * k * m))
    assert shared <= single
    assert single - shared == pytest.approx((n - n // k) * o - (P - 1) * (k - 1) * a * m)
    # the same pieces as steps of their own (no Plan.steps) pay every piece's overhead: no gain
    alone = simulate_plan(build_cpp(layout, shared_budget_requests([m] * n, k * m)), cost).makespan
    assert alone == pytest.approx(single)


def test_a_steps_transfer_carries_its_tokens_with_one_latency():
    """P = 2, blocking, zero compute: each of the S steps is one rendezvous of L + tokens * s, so the
    makespan is S L + (all tokens) s, whatever the number of pieces."""
    L, s = 0.5, 1e-3
    layout = make_layout("loop", 2, 2)
    cost = LinearCost(latency=L, seconds_per_token=s)
    requests, steps = _stream([100, 200, 150, 300], 256)
    trace = simulate_plan(build_cpp(layout, requests, steps=steps), cost)
    assert trace.makespan == pytest.approx(len(steps) * L + 750 * s)


def test_step_overhead_of_the_cost_models():
    assert step_overhead(LinearCost(per_chunk=0.2, stage_weights=(1.0, 3.0)), 1) == pytest.approx(0.6)
    flop = FlopCost(layers_per_stage=(2, 3), launch_overhead=1e-5, launches_per_layer=10)
    assert step_overhead(flop, 1) == pytest.approx(3 * 10 * 1e-5)
    assert step_overhead(object(), 0) == 0.0


def test_steps_must_cover_each_request_in_order():
    layout = make_layout("loop", 4, 2)
    requests = [Request(0, (10, 10)), Request(1, (5,))]
    with pytest.raises(ValueError, match="chunk 0 is due"):
        build_cpp(layout, requests, steps=[[(0, 1), (1, 0)], [(0, 0)]])
    with pytest.raises(ValueError, match="cover only part"):
        build_cpp(layout, requests, steps=[[(0, 0), (1, 0)]])


def test_steps_fill_the_budget_by_cutting_the_next_chunk():
    """vLLM's scheduler cuts a prefill to the room left: every step but the last holds exactly the
    budget, and a request's piece is cut only where the step is full (so a step has at most one cut
    piece, its last)."""
    import random

    rng = random.Random(3)
    for _ in range(50):
        lengths = [rng.randint(1, 700) for _ in range(rng.randint(1, 12))]
        budget = rng.randint(16, 600)
        requests, steps = shared_budget_stream(lengths, budget)
        sizes = {q.id: q.chunk_sizes for q in requests}
        totals = [sum(sizes[q][c] for q, c in g) for g in steps]
        assert all(t == budget for t in totals[:-1]), (lengths, budget, totals)
        assert 0 < totals[-1] <= budget
        assert len(steps) == -(-sum(lengths) // budget)
        for g in steps:
            for q, c in g[:-1]:
                assert c == len(sizes[q]) - 1  # all but the last piece end their request


def test_concurrency_keeps_a_new_request_out_of_the_step_where_its_gate_ends():
    """Under concurrency K request i enters once request i-K has finished: sharing a step with (or
    preceding) request i-K's end would deadlock, so the stream starts it a step later; the plan
    verifies (the verifier runs the admission gate)."""
    lengths, K = [30, 20, 40, 10, 50, 25], 2
    requests, steps = shared_budget_stream(lengths, 128, concurrency=K)
    where = {}
    for k, g in enumerate(steps):
        for q, c in g:
            where.setdefault(q, []).append(k)
    for q in range(K, len(lengths)):
        assert where[q][0] > where[q - K][-1], (q, where)
    verify(build_cpp(make_layout("loop", 4, 2), requests, steps=steps, concurrency=K))


@pytest.mark.parametrize("builder,kind", [(build_cpp, "loop"), (build_vpp, "v"), (build_vpp_async, "v")])
def test_concurrency_gates_hold_on_every_layout(builder, kind):
    """On a V request i's first compute and request i-K's last are both on rank 0: the builder orders
    them (a step-level gate), so the plan verifies; a stream cut without the limit is refused."""
    lengths, K = [30, 20, 40, 10, 50, 25, 5, 5, 5], 2
    layout = make_layout(kind, 8, 2)
    requests, steps = shared_budget_stream(lengths, 64, concurrency=K)
    verify(builder(layout, requests, steps=steps, concurrency=K))
    requests, steps = shared_budget_stream(lengths, 64)
    with pytest.raises(ValueError, match="deadlock"):
        builder(layout, requests, steps=steps, concurrency=K)


def test_a_budget_that_is_not_a_whole_token_count_is_refused_by_name():
    # 1.5 used to cut pieces of 1.5 tokens (refused later, as "chunk sizes [1, 1, 1, 0]"), True ran as
    # a budget of 1, and NaN (NaN < 1 is False) never filled a step: an endless loop growing memory
    for budget in (1.5, True, 0, -2, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"^budget=.* must be an integer number of tokens >= 1$"):
            shared_budget_stream([5, 3], budget)
    for lengths in ([5, 2.5], [5, 0], [True, 3]):
        with pytest.raises(ValueError, match="prompt lengths .* must be integer token counts >= 1"):
            shared_budget_stream(lengths, 4)
    for concurrency in (0, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match=r"^concurrency=.* must be an integer >= 1"):
            shared_budget_stream([5, 3], 4, concurrency=concurrency)
    import numpy as np
    assert shared_budget_stream([np.int64(5), 3], np.int64(4))[1] == shared_budget_stream([5, 3], 4)[1]
