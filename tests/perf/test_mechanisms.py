"""The mechanisms added to the paper-scale model, each against a hand derivation: the launch stall of a
runner that syncs before every step, the profiler's view of waiting, DCPP's online calibration and the
fit of the one new constant."""

import pytest

from benchmarks.paper.fit import fit_host_step
from vpp.perf.arch import Arch
from vpp.perf.configs import get_config
from vpp.perf.decompose import decompose
from vpp.perf.deployment import DeploymentCost
from vpp.perf.hardware import ASCEND_910C
from vpp.perf.ops import Parallel
from vpp.perf.runs import Setup, run
from vpp.schedules import build_cpp, chunk_requests, make_layout, simulate_plan

from tests.perf.archs import DEV, TINY_MLA


class UnitCost:
    """Every stage call 1 s of attention, every transfer 0.5 s, async transfers fully overlappable."""

    overlap = 1.0

    def compute(self, stage, tokens, prefix):
        return 1.0

    def breakdown(self, stage, tokens, prefix):
        return {"attention": 1.0}

    def transfer(self, tokens):
        return 0.5


def _async_cpp(chunks: int):
    layout = make_layout("loop", 2, 2)
    plan = build_cpp(layout, chunk_requests([10 * chunks], 10), comm="async")
    return plan, simulate_plan(plan, UnitCost())


def test_profiler_view_by_hand():
    """Two chunks through 2 stages, non-blocking. Rank 1 posts its first receive at 0, it lands at 1.5;
    rank 0 sends C0 over [1, 1.5] while computing s0/C1 (overlapped) and C1 over [2, 3] (its receive is
    posted when rank 1 ends s1/C0 at 2.5), rank 1 computes C1 over [3, 4]. Comm intervals: rank 0
    [1, 1.5] (overlapped) + [2, 3] (exposed); rank 1 [0, 1.5] + [2.5, 3] (both exposed)."""
    plan, trace = _async_cpp(2)
    row = decompose("x", plan, trace, UnitCost())
    assert row.total == pytest.approx(4.0)
    assert row.compute == pytest.approx(2.0)
    assert row.exposed_comm == pytest.approx((1.0 + 2.0) / 2)
    assert row.bubble == pytest.approx(0.5)
    assert row.comm_total == pytest.approx((1.5 + 2.0) / 2)
    assert row.overlap_ratio == pytest.approx(0.5 / 3.5)
    sim = decompose("x", plan, trace, UnitCost(), view="simulator")   # waiting for the peer's work = bubble
    assert sim.total == row.total and sim.compute == row.compute
    assert sim.exposed_comm < row.exposed_comm and sim.bubble > row.bubble


def test_a_receive_is_posted_no_earlier_than_its_step_is_dispatched():
    """Two one-chunk requests through VPP-Async's V (2 ranks, stages 0/3 on rank 0, 1/2 on rank 1). Rank 1
    ends request 0 at 3.5 and posts request 1's receive at once, but request 1's first stage starts on
    rank 0 only at 5.0 (after rank 0's stage 3 of request 0 over [4, 5]): the engine dispatches request 1's
    step then, so its receive runs over [5.0, 6.5], and [3.5, 5.0] is Free. By hand, rank 0's
    communication is [1, 4] + [6, 9] (6 s, none of it beside a compute), rank 1's [0, 1.5] + [3.5, 4] +
    [5, 6.5] + [8.5, 9] (4 s); each rank computes 4 s of a 10 s makespan. With the post unclamped
    (``profiler-early``) rank 1's second receive runs from 3.5: 5 s."""
    from vpp.schedules import strategies
    from vpp.schedules.ir import Request
    plan = strategies.get("vpp-async").plan(make_layout("v", 4, 2), [Request(0, (10,)), Request(1, (10,))])
    trace = simulate_plan(plan, UnitCost())
    row = decompose("x", plan, trace, UnitCost())
    assert (row.total, row.compute) == pytest.approx((10.0, 4.0))
    assert row.exposed_comm == pytest.approx((6.0 + 4.0) / 2) and row.bubble == pytest.approx(1.0)
    early = decompose("x", plan, trace, UnitCost(), view="profiler-early")
    assert early.exposed_comm == pytest.approx((6.0 + 5.0) / 2) and early.bubble == pytest.approx(0.5)
    assert early.total == row.total and early.compute == row.compute


def test_blocking_plans_wait_as_free_in_both_views():
    layout = make_layout("loop", 2, 2)
    plan = build_cpp(layout, chunk_requests([20], 10))
    trace = simulate_plan(plan, UnitCost())
    a, b = (decompose("x", plan, trace, UnitCost(), view=v) for v in ("profiler", "simulator"))
    assert (a.bubble, a.exposed_comm) == pytest.approx((b.bubble, b.exposed_comm))
    assert a.overlap_ratio == 0.0


def test_launch_stall_is_device_idle_on_synced_steps_only():
    arch, par = Arch.from_config(TINY_MLA), Parallel(tp=2, weight_bytes=1)
    dev = DEV.replace(host_step=0.25)
    layout = make_layout("loop", 2, 2)
    plain = DeploymentCost(arch, dev, layout, par)
    synced = DeploymentCost(arch, dev, layout, par, sync_steps=True)
    assert synced.compute(0, 64, 128) == pytest.approx(plain.compute(0, 64, 128) + 0.25)
    assert synced.breakdown(0, 64, 128)["launch_stall"] == 0.25 and "launch_stall" not in plain.breakdown(0, 64, 128)
    plan = build_cpp(layout, chunk_requests([256], 64))
    row = decompose("x", plan, simulate_plan(plan, synced), synced)
    ref = decompose("x", plan, simulate_plan(plan, plain), plain)
    assert row.launch_stall == pytest.approx(4 * 0.25)             # 4 chunks, one stage per rank: 4 calls per rank
    assert row.compute == pytest.approx(ref.compute)               # a stall is not computation ...
    assert row.free + row.launch_stall == pytest.approx(row.bubble)  # ... it is bubble
    assert row.compute + row.bubble + row.exposed_comm == pytest.approx(row.total)


def test_only_dcpp_with_online_timing_syncs():
    setup = Setup(Arch.from_config(TINY_MLA), DEV, Parallel(tp=2, weight_bytes=1))
    layout = setup.layout("loop")
    assert setup.cost(layout, "dcpp").sync_steps
    assert not setup.cost(layout, "cpp").sync_steps and not setup.cost(layout).sync_steps
    assert not setup.replace(dcpp_online=False).cost(layout, "dcpp").sync_steps
    assert not setup.replace(dcpp_variant="sglang").cost(layout, "dcpp").sync_steps


def test_online_calibration_plans_chunk_by_chunk():
    """With online timing the target is reset to the first chunk's measured time (which includes the
    fit's constant, so later chunks come out larger than offline) and the planner re-fits its history
    model from the observed chunk times."""
    arch = Arch.from_config(get_config("deepseek"))
    dev = ASCEND_910C.replace(eff_attn=0.5, eff_link=0.3)
    online = Setup(arch, dev, Parallel(tp=8, weight_bytes=1))
    offline = online.replace(dcpp_online=False)
    a = run(online, "dcpp", [262144], 16384).requests[0].chunk_sizes
    b = run(offline, "dcpp", [262144], 16384).requests[0].chunk_sizes
    assert sum(a) == sum(b) == 262144 and a[0] == b[0] == 16384 and a[1] > b[1]


def test_fit_host_step_recovers_a_known_value():
    arch = Arch.from_config(get_config("deepseek"))
    truth = Setup(arch, ASCEND_910C.replace(eff_attn=0.5, eff_link=0.3, host_step=0.02), Parallel(tp=8, weight_bytes=1))
    target = run(truth, "dcpp", [131072], 16384).row.launch_stall
    start = truth.replace(device=truth.device.replace(host_step=0.0))
    fitted, h, got = fit_host_step(start, length=131072, chunk=16384, target=target)
    assert h == pytest.approx(0.02, rel=1e-3) and got == pytest.approx(target, rel=1e-6)


def test_calibration_sync_stalls_only_the_steps_the_planner_times():
    """dcpp_sync="calibration": the stall lands on the steps taken while the planner times. vLLM-Ascend main
    keeps timing on until three prefix-free steps have reset its target, so one long request syncs on every
    step, while a stream of prompts stops syncing after its calibration."""
    arch = Arch.from_config(get_config("deepseek"))
    dev = ASCEND_910C.replace(eff_attn=0.5, eff_link=0.3, host_step=0.02)
    every = Setup(arch, dev, Parallel(tp=8, weight_bytes=1), dcpp_sync="every-step")
    calib = every.replace(dcpp_sync="calibration")
    a, b = run(every, "dcpp", [524288], 8192), run(calib, "dcpp", [524288], 8192)
    assert a.requests[0].chunk_sizes == b.requests[0].chunk_sizes
    assert b.row.launch_stall == pytest.approx(a.row.launch_stall) == pytest.approx(0.02 * a.row.chunks)
    lengths = [65536] * 12
    a, b = run(every, "dcpp", lengths, 8192), run(calib, "dcpp", lengths, 8192)
    assert a.row.launch_stall == pytest.approx(0.02 * a.row.chunks)          # every rank runs every chunk once
    assert 0 < b.row.launch_stall < a.row.launch_stall
    with pytest.raises(ValueError, match="dcpp_sync"):
        every.replace(dcpp_sync="sometimes").cost(every.layout("loop"), "dcpp")
