"""Request streams and pipelined packing (Algorithm 2), against hand derivations under Eq. 2.

Setting of the derivations: P = 2, a V of 4 stages, tau_k = (k + 1) t per stage, no transfer time,
requests of N chunks. One request alone (tests/schedules/test_simulator.py): rank 1 starts s1/C_k at
W_k = t + k (k+1) t, the makespan is (N+1)^2 t, and after s3/C_{N-2} rank 0 idles for the drain window
2 tau_{N-1} - tau_{N-2} = (N+1) t until s2/C_{N-1} arrives; rank 1 then idles while rank 0 runs
s3/C_{N-1} (N t).

Sequential (VPP, VPP-Async): R' starts when R is done, so the stream is R's timeline twice, 2 (N+1)^2 t,
and rank 1's idle gap between its last compute of R and its first of R' is N t (s3/C_{N-1}) + t
(s0/C'_0 on rank 0) = (N+1) t: the drain again.

Packed, N = 5..8 (so that the window (N+1) t holds C'_0..C'_2, 1 + 2 + 3 = 6 <= N + 1, but not C'_3,
10 > N + 1): R is not delayed and is done at (N+1)^2 t. Rank 1 is done with R at (N+1)^2 t - N t and
runs s1, s2 of C'_0..C'_2 (2 (1+2+3) t = 12 t) back to back. Rank 0, once R is done, runs R''s own
VPP-Async order from where packing left it: s3/C'_0 (t), then s0/C'_3 (4 t). Rank 1 starts C'_3 at

    W'_3 = max((N+1)^2 - N + 12, (N+1)^2 + 5) t,

and from then on it is busy (W'_{k+1} = W'_k + 2 tau'_k) exactly as in the sequential stream, where
R' starts at (N+1)^2 t and W'_3 = (N+1)^2 t + t + 3 * 4 t = (N+1)^2 t + 13 t. The two streams differ by
the shift of W'_3:

    makespan(sequential) - makespan(packed) = 13 t - max(12 - N, 5) t = 6, 7, 8, 8 t for N = 5, 6, 7, 8.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vpp.schedules import (COMPUTE, LinearCost, PlanError, Request, build_cpp, build_vpp,
                           build_vpp_async, build_vpp_packed, chunk_requests, drain_idle, drain_windows,
                           live_requests, make_layout, packed_chunks, request_done_times, request_ttft, simulate_plan,
                           stream_stats, summarize, verify)
from vpp.schedules.ir import replace_actions
from vpp.schedules.packing import default_cost
from vpp.schedules.summary import timeline
from tests.schedules.checks import check_runs_everything_once

C = 100


def eq2(**kw):
    return LinearCost.eq2(1.0, C, **kw)


def v2():
    return make_layout("v", 8, 2)


def computes(plan, rank):
    return [(a.stage, a.request, a.chunk) for a in plan.computes(rank)]


def spans(trace, rank, request=None):
    return [(s.stage, s.request, s.chunk, s.start, s.end) for s in trace.of(rank, "compute")
            if request is None or s.request == request]


def gaps(trace, rank):
    return [(a, b) for kind, a, b, _ in timeline(trace)[rank] if kind == "bubble"]


# -- properties over layouts and request mixes -------------------------------------------------------------

@st.composite
def streams(draw):
    n = draw(st.integers(1, 4))
    arrivals = sorted(draw(st.lists(st.sampled_from([0.0, 0.0, 3.0, 20.0, 200.0]), min_size=n, max_size=n)))
    return [Request(i, tuple(draw(st.lists(st.integers(1, 64), min_size=1, max_size=5))), arrivals[i])
            for i in range(n)]


@st.composite
def folded_layouts(draw):
    kind = draw(st.sampled_from(["v", "v", "interleaved"]))
    pp, folds = draw(st.integers(1, 4)), draw(st.integers(1, 2))
    return make_layout(kind, 2 * folds * pp + draw(st.integers(0, 2)), pp, folds=folds)


def check_chunks_in_order(plan):
    """On every stage each request's chunks run in order, and requests enter every stage in plan order."""
    rank_of = {q.id: i for i, q in enumerate(plan.requests)}
    for acts in plan.actions:
        for s in {a.stage for a in acts if a.op == COMPUTE}:
            seen = [(rank_of[a.request], a.chunk) for a in acts if a.op == COMPUTE and a.stage == s]
            assert seen == sorted(seen)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=folded_layouts(), requests=streams(), concurrency=st.sampled_from([None, 1, 2]),
       with_cost=st.booleans())
def test_packed_plans_verify_and_keep_every_order(layout, requests, concurrency, with_cost):
    cost = LinearCost(per_chunk=0.5, per_token=0.02, per_token_prefix=3e-4, latency=0.2, overlap=0.5)
    plan = build_vpp_packed(layout, requests, cost=cost if with_cost else None, concurrency=concurrency)
    for semantics in ("async", "serial", "blocking"):
        verify(plan, semantics=semantics)
    check_runs_everything_once(plan)
    check_chunks_in_order(plan)
    trace = simulate_plan(plan, cost)
    done = request_done_times(trace, plan)
    for s in trace.of(kind="compute"):
        assert s.start >= plan.request(s.request).arrival - 1e-9  # nothing before its request arrives
    firsts = {s.request: s.start for s in trace.of(kind="compute") if (s.stage, s.chunk) == (0, 0)}
    for i, q in enumerate(requests):
        if concurrency and i >= concurrency:
            assert firsts[q.id] >= done[requests[i - concurrency].id] - 1e-9  # at most K in flight
    if concurrency:
        assert live_requests(trace, plan) <= concurrency


@pytest.mark.parametrize("pp,folds,kind", [(1, 1, "v"), (2, 1, "v"), (3, 1, "v"), (4, 1, "v"), (2, 2, "v"),
                                           (4, 2, "v"), (3, 1, "interleaved")])
def test_packing_removes_drain_idle_for_deeper_pipelines(pp, folds, kind):
    layout = make_layout(kind, 2 * folds * pp, pp, folds=folds)
    requests = chunk_requests([8 * C] * 3, C)
    cost = eq2(latency=0.05)
    packed, alone = build_vpp_packed(layout, requests, cost=cost), build_vpp_async(layout, requests)
    tp, ta = simulate_plan(packed, cost), simulate_plan(alone, cost)
    if pp == 1 or kind == "interleaved":
        # One rank never idles; on an interleaved layout rank 0's share of R ends before R drains on the
        # other ranks, so R' follows it there without packing: nothing to pack either way.
        assert sum(packed_chunks(packed).values()) == 0 and tp.makespan <= ta.makespan + 1e-9
        return
    assert sum(packed_chunks(packed).values()) > 0
    assert tp.makespan < ta.makespan
    assert drain_idle(tp, packed) < 0.5 * drain_idle(ta, alone)


def _drain_idle_every_window(trace, plan) -> float:
    """drain_idle as first written: every bubble against every merged drain window."""
    merged = []
    for a, b in sorted((a, b) for _, a, b in drain_windows(trace, plan) if b > a):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return sum(sum(max(0.0, min(b, w1) - max(a, w0)) for w0, w1 in merged)
               for segs in timeline(trace) for kind, a, b, _ in segs if kind == "bubble")


@pytest.mark.parametrize("pp,arrivals", [(2, (0.0, 0.0, 0.0, 0.0)), (4, (0.0, 3.0, 40.0, 41.0)),
                                        (3, (0.0, 90.0, 95.0, 300.0))])
def test_drain_idle_reads_only_the_windows_a_bubble_meets(pp, arrivals):
    layout = make_layout("v", 2 * pp, pp)
    requests = chunk_requests([8 * C, 3 * C, 5 * C, 2 * C], C, arrivals=arrivals)
    for plan in (build_vpp_async(layout, requests), build_vpp_packed(layout, requests, cost=eq2(latency=0.05))):
        trace = simulate_plan(plan, eq2(latency=0.05))
        assert drain_idle(trace, plan) == _drain_idle_every_window(trace, plan) > 0


def test_one_request_or_concurrency_one_is_vpp_async():
    layout, cost = make_layout("v", 12, 3), eq2(latency=0.3, overlap=0.5)
    one = chunk_requests([700], C)
    assert all(computes(build_vpp_packed(layout, one, cost=cost), r) == computes(build_vpp_async(layout, one), r)
               for r in range(3))
    assert simulate_plan(build_vpp_packed(layout, one, cost=cost), cost).makespan == \
        pytest.approx(simulate_plan(build_vpp_async(layout, one), cost).makespan)
    three = chunk_requests([700, 500, 900], C)
    solo = build_vpp_packed(layout, three, cost=cost, concurrency=1)
    assert solo.concurrency == 1 and packed_chunks(solo) == {0: 0, 1: 0, 2: 0}
    assert all(computes(solo, r) == computes(build_vpp_async(layout, three), r) for r in range(3))


def test_loop_layouts_are_refused():
    with pytest.raises(ValueError, match="needs a folded layout"):
        build_vpp_packed(make_layout("loop", 4, 2), chunk_requests([300], C))


# -- the drain window, Algorithm 2, Sec. 4.7 ---------------------------------------------------------------

def test_drain_window_holds_three_chunks_of_the_next_request():
    """N = 8, t = 1: the window is (N+1) t = 9; C'_0..C'_2 (1 + 2 + 3 = 6) fit, C'_3 (4 > 3 left) does not."""
    n = 8
    alone = simulate_plan(build_vpp_async(v2(), chunk_requests([n * C], C)), eq2())
    window = gaps(alone, 0)
    assert window == [(pytest.approx(64.0), pytest.approx(73.0))]
    assert window[0][1] - window[0][0] == pytest.approx((n + 1) * 1.0)

    plan = build_vpp_packed(v2(), chunk_requests([n * C, n * C], C))  # the linear law: no cost model needed
    assert packed_chunks(plan) == {0: 0, 1: 3}
    trace = simulate_plan(plan, eq2())
    inside = [(s, q, c, b - a) for s, q, c, a, b in spans(trace, 0) if a >= 64.0 - 1e-9 and b <= 73.0 + 1e-9]
    assert inside == [(0, 1, 0, 1.0), (0, 1, 1, 2.0), (0, 1, 2, 3.0)]
    assert gaps(trace, 0)[0] == (pytest.approx(70.0), pytest.approx(73.0))  # 9 - 6 = 3 units left
    assert request_done_times(trace, plan)[0] == pytest.approx((n + 1) ** 2)  # R is not delayed


def test_default_estimate_is_the_linear_law():
    layout = v2()
    cost = default_cost(layout, chunk_requests([800, 300], C))
    assert [cost.compute(1, C, k * C) for k in range(4)] == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("n,saved", [(5, 6.0), (6, 7.0), (7, 8.0), (8, 8.0)])
def test_packing_shortens_a_two_request_stream_as_derived(n, saved):
    requests = chunk_requests([n * C, n * C], C)
    sequential = simulate_plan(build_vpp_async(v2(), requests), eq2())
    packed_plan = build_vpp_packed(v2(), requests, cost=eq2())
    packed = simulate_plan(packed_plan, eq2())
    assert packed_chunks(packed_plan)[1] == 3
    assert sequential.makespan == pytest.approx(2 * (n + 1) ** 2)
    assert packed.makespan == pytest.approx(2 * (n + 1) ** 2 - saved)
    assert saved == 13 - max(12 - n, 5)
    w3 = next(a for s, q, c, a, b in spans(packed, 1) if (s, q, c) == (1, 1, 3))
    assert w3 == pytest.approx(max((n + 1) ** 2 - n + 12, (n + 1) ** 2 + 5))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 9, 12])
def test_packing_strictly_helps_two_requests_for_any_length(n):
    requests = chunk_requests([n * C, n * C], C)
    assert simulate_plan(build_vpp_packed(v2(), requests, cost=eq2()), eq2()).makespan < 2 * (n + 1) ** 2


@pytest.mark.parametrize("builder", [build_vpp, build_vpp_async])
def test_sequential_vpp_idles_its_drain_between_requests(builder):
    n = 6
    plan = builder(v2(), chunk_requests([n * C, n * C], C))
    assert max(i for i, t in enumerate(computes(plan, 0)) if t[1] == 0) < \
        min(i for i, t in enumerate(computes(plan, 0)) if t[1] == 1)  # R' enters after R's last compute
    trace = simulate_plan(plan, eq2())
    assert trace.makespan == pytest.approx(2 * (n + 1) ** 2)
    r1_last = max(b for s, q, c, a, b in spans(trace, 1, 0))
    r1_next = min(a for s, q, c, a, b in spans(trace, 1, 1))
    assert r1_next - r1_last == pytest.approx(n + 1)  # rank 1: s3/C_{N-1} (N t) + s0/C'_0 (t)
    drains0 = [b - a for a, b in gaps(trace, 0)]
    assert drains0 == [pytest.approx(n + 1)] * 2  # rank 0: the drain window of each request
    assert drain_idle(trace, plan) == pytest.approx(2 * n + 1)  # one boundary: (N+1) t + N t


def test_pipelined_vpp_is_still_available():
    requests = chunk_requests([400, 400], C)
    plan = verify(build_vpp(v2(), requests, request_order="pipelined"))
    order = computes(plan, 0)
    assert order.index((0, 1, 0)) < order.index((3, 0, 3))  # R' enters before R's last compute
    with pytest.raises(ValueError, match="request_order"):
        build_vpp(v2(), requests, request_order="packed")


# -- arrivals, admission, TTFT ---------------------------------------------------------------------------

def test_arrivals_limit_packing_and_idle_before_them_is_waiting():
    n = 8
    mid = chunk_requests([n * C, n * C], C, arrivals=[0.0, 68.0])  # arrives 4 units into the window
    plan = build_vpp_packed(v2(), mid, cost=eq2())
    assert packed_chunks(plan)[1] == 2  # C'_0 + C'_1 = 3 <= 73 - 68 = 5; C'_2 would need 3 more
    trace = simulate_plan(plan, eq2())
    first = next(a for s, q, c, a, b in spans(trace, 0, 1))
    assert first == pytest.approx(68.0)

    late = chunk_requests([n * C, n * C], C, arrivals=[0.0, 100.0])  # after R is done (81)
    plan = build_vpp_packed(v2(), late, cost=eq2())
    assert packed_chunks(plan)[1] == 0
    trace = simulate_plan(plan, eq2())
    s = summarize(trace)
    assert trace.makespan == pytest.approx(100 + (n + 1) ** 2)
    assert s.waiting == pytest.approx(2 * (100 - 81))  # nothing in the system: both ranks wait
    assert s.bubble == pytest.approx(2 * 2 * (n + 1))  # each request's own fill and drain, 2 (N+1) t
    assert s.bubble_ratio == pytest.approx(s.bubble / (2 * trace.makespan - s.waiting))
    assert [w.kind for w in trace.of(0, "wait")] == ["wait"]
    assert stream_stats(trace, plan).ttft == {0: pytest.approx(81.0), 1: pytest.approx(81.0)}


def test_concurrency_gates_admission_and_ttft_starts_at_admission():
    requests = chunk_requests([4 * C] * 3, C)
    plan = verify(build_cpp(make_layout("loop", 4, 2), requests, concurrency=1))
    trace = simulate_plan(plan, eq2(stage_weights=(2.0, 2.0)))
    done = request_done_times(trace, plan)
    firsts = [a for s, q, c, a, b in spans(trace, 0) if (s, c) == (0, 0)]
    assert firsts[1] == pytest.approx(done[0]) and firsts[2] == pytest.approx(done[1])
    ttft = request_ttft(trace, plan)
    assert ttft[1] == pytest.approx(done[1] - done[0]) and ttft[0] == pytest.approx(done[0])
    stats = stream_stats(trace, plan)
    assert stats.throughput == pytest.approx(12 * C / done[2])
    assert stats.ttft_median == pytest.approx(sorted(ttft.values())[1])


def test_a_gate_that_waits_on_a_later_compute_of_its_rank_is_a_deadlock():
    pipelined = build_vpp(v2(), chunk_requests([400, 400], C), request_order="pipelined")
    gated = replace_actions(pipelined, pipelined.actions, concurrency=1)
    with pytest.raises(PlanError, match=r"until request 0 has finished \(concurrency 1\)"):
        verify(gated)


def test_kv_caches_of_two_requests_coexist_when_packed():
    requests = chunk_requests([800, 800, 800], C)
    packed = build_vpp_packed(v2(), requests, cost=eq2(), concurrency=2)
    trace = simulate_plan(packed, eq2())
    assert live_requests(trace, packed) == 2  # R's caches live until R finishes, R' has started
    alone = build_vpp_async(v2(), requests)
    assert live_requests(simulate_plan(alone, eq2()), alone) == 1
    windows = drain_windows(trace, packed)
    assert [w[0] for w in windows] == [0, 1] and all(a < b for _, a, b in windows)


def test_plans_with_arrivals_and_concurrency_round_trip():
    from vpp.schedules import Plan
    plan = build_vpp_packed(v2(), chunk_requests([300, 200], C, arrivals=[0.0, 2.5]), concurrency=2)
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.requests[1].arrival == 2.5 and back.concurrency == 2
    with pytest.raises(ValueError, match="arrival"):
        Request(0, (3,), -1.0)
    with pytest.raises(ValueError, match="concurrency"):
        replace_actions(plan, plan.actions, concurrency=0)
