"""Requests with a cached prefix in the IR, the verifier and the simulator: chunks start at the
prefix, the cost model charges it as present (closed form on LinearCost), the plan round-trips, and
tail merging joins a small final chunk to the one before."""

import pytest

from vpp.schedules import Plan, Request, build_cpp, build_vpp_async, chunk_requests, make_layout, simulate_plan, verify
from vpp.schedules.cost import LinearCost
from vpp.schedules.ir import merge_tail


def test_offsets_and_length_count_the_prefix():
    q = Request(3, (64, 64, 10), cached=100)
    assert [q.offset(c) for c in range(3)] == [100, 164, 228]
    assert q.length == 238 and q.new_tokens == 138
    assert Request.from_dict(q.to_dict()) == q and "cached" not in Request(0, (5,)).to_dict()
    with pytest.raises(ValueError, match="cached=-1"):
        Request(0, (5,), cached=-1)


@pytest.mark.parametrize("builder, kind", [(build_cpp, "loop"), (build_vpp_async, "v")])
def test_simulated_chunks_attend_to_the_cached_prefix(builder, kind):
    layout = make_layout(kind, 8, 2)
    cost = LinearCost(per_chunk=1e-3, per_token=1e-5, per_token_prefix=1e-7, stage_weights=(1.0,) * layout.num_stages)
    reqs = [Request(0, (32, 32), cached=500)]
    plan = verify(builder(layout, reqs))
    assert Plan.from_json(plan.to_json()).requests == plan.requests
    trace = simulate_plan(plan, cost)
    for s in trace.of(kind="compute"):
        offset = 500 + 32 * s.chunk
        # LinearCost: per_chunk + per_token t + per_token_prefix t * offset, per stage weight 1
        assert s.duration == pytest.approx(cost.compute(s.stage, 32, offset))
        assert s.duration == pytest.approx(1e-3 + 1e-5 * 32 + 1e-7 * 32 * offset)


def test_merge_tail():
    assert merge_tail([4096, 4096, 4096, 3904, 192], 256) == [4096, 4096, 4096, 4096]
    assert merge_tail([4096, 192], 192) == [4096, 192]            # strictly smaller than the threshold
    assert merge_tail([100], 256) == [100]                        # nothing to join
    assert [q.chunk_sizes for q in chunk_requests([16576, 8192], 4096, merge_tail_below=256)] == \
        [(4096, 4096, 4096, 4288), (4096, 4096)]
