"""DCPP planners on a synthetic quadratic cost, checked against chunk sequences computed by hand."""

import math

import pytest
from hypothesis import given, settings, strategies as st

from vpp.schedules import build_cpp, make_layout, simulate_plan, summarize, verify
from vpp.schedules.cost import LinearCost
from vpp.schedules.dcpp import (DcppPlanner, dcpp_requests, fit_quadratic, profile_sizes, profiled_stages,
                                stage_measure)

# f(l) = a l^2 + b l + c in seconds, with b / a = 8192 tokens. Scaling f does not change any chunk.
A, B_LIN, C = 1e-9, 8192e-9, 1e-4
BUDGET = 8192


def f(n: int) -> float:
    return A * n * n + B_LIN * n + C


def planner(variant: str, **kw) -> DcppPlanner:
    return DcppPlanner(variant=variant, budget=BUDGET, **kw).profile(f)


# Hand computation, in units of A (so a = 1, b = 8192):
#   T = a B^2 + b B = 8192^2 + 8192^2 = 134,217,728.
#   At prefix L: x^2 + (2L + 8192) x - T = 0  ->  x* = (-(2L + 8192) + sqrt((2L + 8192)^2 + 4T)) / 2.
#   L =  8192: q = 24576, q^2 + 4T = 1,140,850,688, sqrt = 33776.48, x* = 4600.24
#   L = 12800: q = 33792, q^2 + 4T = 1,678,770,176, sqrt = 40972.80, x* = 3590.40
#   L = 16448: q = 41088, q^2 + 4T = 2,225,094,656, sqrt = 47170.91, x* = 3041.45
#   L = 19520: q = 47232, q^2 + 4T = 2,767,732,736, sqrt = 52609.25, x* = 2688.62
#   L = 22208: q = 52608, q^2 + 4T = 3,304,472,576, sqrt = 57484.54, x* = 2438.27
#   L = 13632: q = 35456, q^2 + 4T = 1,793,998,848, x* = 3449.81
#   L = 18240: q = 44672, q^2 + 4T = 2,532,458,496, x* = 2825.77


def test_vllm_ascend_sequence_by_hand():
    # s = 1, floor 1024, round UP to 64, cap by what is left (24576 tokens in all):
    #   L=0: the first chunk is the budget, 8192
    #   L=8192:  int(4600.24) = 4600 -> up to 4608
    #   L=12800: int(3590.40) = 3590 -> up to 3648
    #   L=16448: int(3041.45) = 3041 -> up to 3072
    #   L=19520: int(2688.62) = 2688 -> already aligned, 2688
    #   L=22208: int(2438.27) = 2438 -> up to 2496, capped by the 2368 left
    want = [8192, 4608, 3648, 3072, 2688, 2368]
    assert planner("vllm-ascend", min_chunk=1024).chunk_sizes(24576) == want


def test_vllm_ascend_default_floor_4096():
    # default min_chunk = 4096 (clamped to B only below it): L=8192 -> 4608 as above; L=12800 -> 3590 < 4096 -> 4096,
    # and 4096 from there on; 32768 - 12800 = 19968 = 4 * 4096 + 3584.
    p = planner("vllm-ascend")
    assert p.min_chunk == 4096 and p.smoothing == 1.0
    assert p.chunk_sizes(32768) == [8192, 4608, 4096, 4096, 4096, 4096, 3584]


def test_sglang_sequence_by_hand():
    # s = 0.75, floor B // 4 = 2048 on int(x_s), round DOWN to 64, cap by what is left (24576 tokens):
    #   L=0: 8192
    #   L=8192:  x_s = 8192 + 0.75 (4600.24 - 8192) = 5498.18 -> 5498 -> down to 5440
    #   L=13632: x_s = 8192 + 0.75 (3449.81 - 8192) = 4635.36 -> 4635 -> down to 4608
    #   L=18240: x_s = 8192 + 0.75 (2825.77 - 8192) = 4167.33 -> 4167 -> down to 4160
    #   L=22400: 2176 left -> 2176
    p = planner("sglang")
    assert p.smoothing == 0.75 and p.min_chunk == 2048
    assert p.chunk_sizes(24576) == [8192, 5440, 4608, 4160, 2176]


def test_fit_recovers_coefficients():
    sizes = profile_sizes("vllm-ascend", BUDGET)[1:]
    a, b, c = fit_quadratic(sizes, [f(n) for n in sizes])
    assert a == pytest.approx(A, rel=1e-6) and b == pytest.approx(B_LIN, rel=1e-6) and c == pytest.approx(C, rel=1e-6)
    p = planner("sglang")
    # the planner works in milliseconds, as both engines do
    assert (p.a, p.b, p.c) == pytest.approx((A * 1e3, B_LIN * 1e3, C * 1e3), rel=1e-6)
    assert p.target == pytest.approx((f(BUDGET) - f(0)) * 1e3, rel=1e-9)


def test_profile_sizes_follow_the_sources():
    v = profile_sizes("vllm-ascend", 6400)
    assert len(v) == 65 and v[0] == 6500 and v[1] == 6400 and v[2] == 6300 and v[-1] == 100  # warm-up first
    s = profile_sizes("sglang", 8192)
    assert len(s) == 128 and s[0] == 10240 and s[1] == 10240 - 80 and s[-1] == 10240 - 127 * 80
    seen = []
    DcppPlanner("vllm-ascend", budget=6400).profile(lambda n: seen.append(n) or f(n))
    assert seen == v


@settings(max_examples=40, deadline=None)
@given(variant=st.sampled_from(["vllm-ascend", "sglang"]), budget=st.sampled_from([1024, 4096, 8192, 24576]),
       ratio=st.floats(0.05, 50.0), length=st.integers(1, 300_000))
def test_invariants(variant, budget, ratio, length):
    # f = l^2 + ratio * budget * l: shrinking, floors, alignment and caps hold for any shape.
    p = DcppPlanner(variant=variant, budget=budget).profile(lambda n: n * n + ratio * budget * n + 5.0)
    sizes = p.chunk_sizes(length)
    assert sum(sizes) == length and all(n >= 1 for n in sizes)
    assert sizes[0] == min(budget, length)
    body = sizes[:-1]                      # the last chunk is whatever is left
    assert all(n <= budget for n in sizes)
    assert all(x >= y for x, y in zip(body, body[1:])), "chunks must not grow with the prefix"
    floor = p.min_chunk if variant == "vllm-ascend" else (p.min_chunk // 64) * 64
    assert all(n >= min(floor, budget) for n in body)
    assert all(n % 64 == 0 or n == budget for n in body)


def test_smoothing_zero_is_fixed_chunking():
    p = DcppPlanner("sglang", budget=BUDGET, smoothing=0.0).profile(f)
    assert p.chunk_sizes(30000) == [8192, 8192, 8192, 5424]


def test_online_refit_vllm_ascend():
    p = planner("vllm-ascend", min_chunk=64)
    truth = lambda n, h: 3e-9 * n * (n + h) + 2e-6 * (n + h) + 1e-3   # a slower machine than profiled
    fitted = [p.observe(n, h, truth(n, h)) for n, h in [(4096, 0), (4096, 4096), (2048, 8192), (1024, 10240),
                                                         (3000, 11264), (512, 14264)]]
    assert fitted == [False, False, False, False, True, True]
    assert p.history_coef == pytest.approx((3e-6, 2e-3, 1.0), rel=1e-6)   # ms
    assert p.target == pytest.approx(truth(4096, 0) * 1e3)   # reset to the first prefix-free step's time
    # the next chunk solves a x (x + H) + b (x + H) + c = T with the re-fitted model
    h, ha, hb, hc = 20000, 3e-6, 2e-3, 1.0
    qb, qc = ha * h + hb, hb * h + hc - p.target
    x = (-qb + math.sqrt(qb * qb - 4 * ha * qc)) / (2 * ha)
    assert p.next_chunk(h, 10 ** 6) == max(-(-int(x) // 64) * 64, 64)
    assert not DcppPlanner("sglang", budget=BUDGET).profile(f).observe(100, 0, 1.0)


def test_bad_fits():
    with pytest.raises(ValueError, match="not positive"):
        DcppPlanner("sglang", budget=BUDGET).profile(lambda n: 1.0 + 1e-6 * n - 1e-12 * n * n)
    p = DcppPlanner("vllm-ascend", budget=BUDGET).profile(lambda n: 1.0 + 1e-6 * n - 1e-12 * n * n)
    assert p.a < 0 and p.chunk_sizes(20000)[0] == BUDGET          # main (#10746) keeps a negative fit
    p = DcppPlanner("vllm-ascend-7896", budget=BUDGET).profile(lambda n: 1.0 + 1e-6 * n - 1e-12 * n * n)
    assert p.a == 1e-9                                              # #7896 clamps it to 1e-9 ms/token^2
    with pytest.raises(ValueError, match="unknown DCPP mode"):
        DcppPlanner("orca")


def test_requests_feed_cpp_and_simulate():
    layout = make_layout("loop", 8, 2)
    cost = LinearCost(per_chunk=1e-3, per_token=1e-6, per_token_prefix=2e-10, stage_weights=(1.0, 1.0))
    p = DcppPlanner("vllm-ascend", budget=4096).profile(stage_measure(cost, profiled_stages(layout, "vllm-ascend")))
    reqs = dcpp_requests([40000, 9000], p)
    assert [q.length for q in reqs] == [40000, 9000] and reqs[0].num_chunks > 40000 // 4096
    plan = verify(build_cpp(layout, reqs))
    s = summarize(simulate_plan(plan, cost))
    assert s.makespan > 0 and s.compute > 0


@pytest.mark.parametrize("variant", ["vllm-ascend", "vllm-ascend-7896", "sglang"])
def test_merge_tail_joins_the_last_chunk_in_every_mode(variant):
    from vpp.schedules.ir import merge_tail
    for length in (24576 + 100, 30000, 65536 + 777, 8192 + 63):
        plain = planner(variant).chunk_sizes(length)
        merged = DcppPlanner(variant=variant, budget=BUDGET, merge_tail=1024).profile(f).chunk_sizes(length)
        assert merged == merge_tail(plain, 1024) and sum(merged) == length
    assert planner(variant).chunk_sizes(8192 + 63) == [8192, 63]
    assert DcppPlanner(variant=variant, budget=BUDGET, merge_tail=64).profile(f).chunk_sizes(8192 + 63) == [8255]
