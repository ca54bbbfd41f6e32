"""Device timing, the deployment cost model's stage sums, the CPP fit and the paper decomposition."""

import pytest

from vpp.perf.arch import Arch
from vpp.perf.configs import get_config
from vpp.perf.deployment import DeploymentCost
from vpp.perf.hardware import ASCEND_910C, get_device
from vpp.perf.ops import Op, Parallel, embed_ops, head_ops, layer_ops
from vpp.perf.runs import Setup, run
from vpp.schedules import make_layout

from tests.perf.archs import DEV, TINY_MLA

def test_op_times_by_hand():
    # compute-bound GEMM: 1e9 FLOPs at 1e12 * 0.5 = 2 ms, + 1 launch
    assert DEV.op_time(Op("g", "gemm", "gemm", flops=1e9, bytes=1e3)) == pytest.approx(2e-3 + 2e-6)
    # the same at low precision runs twice as fast
    assert DEV.op_time(Op("g", "gemm", "gemm", flops=1e9, bytes=1e3, lowp=True)) == pytest.approx(1e-3 + 2e-6)
    # memory-bound GEMM: 1e8 bytes at 1e11 * 0.5 = 2 ms
    assert DEV.op_time(Op("g", "gemm", "gemm", flops=1e3, bytes=1e8, kernels=3)) == pytest.approx(2e-3 + 6e-6)
    assert DEV.op_time(Op("a", "attn", "attention", flops=1e9)) == pytest.approx(4e-3 + 2e-6)
    # ring all-reduce of 8e6 bytes over 4 ranks: 6 steps of latency + 2 * 3/4 * 8e6 / 5e9
    assert DEV.op_time(Op("r", "allreduce", "tp_comm", bytes=8e6, group=4)) == pytest.approx(6e-6 + 2.4e-3)
    assert DEV.allgather(8e6, 4) == pytest.approx(3e-6 + 1.2e-3)
    assert DEV.allreduce(8e6, 1) == 0.0


def test_stage_sums_layers_embedding_and_head():
    arch = Arch.from_config(TINY_MLA)
    par = Parallel(tp=2, weight_bytes=1)
    layout = make_layout("loop", 2, 2)
    cost = DeploymentCost(arch, DEV, layout, par)
    c, L = 4, 6
    t0 = sum(DEV.op_time(op) for op in layer_ops(arch, 0, c, L, par) + embed_ops(arch, c, par))
    t1 = sum(DEV.op_time(op) for op in layer_ops(arch, 1, c, L, par) + head_ops(arch, c, par))
    assert cost.compute(0, c, L) == pytest.approx(t0) and cost.compute(1, c, L) == pytest.approx(t1)
    assert sum(cost.breakdown(0, c, L).values()) == pytest.approx(t0)
    assert cost.breakdown(0, c, L)["launch"] > 0 and "tp_comm" in cost.breakdown(0, c, L)
    msg = c * 64 * 2 * 2
    assert cost.transfer(c) == pytest.approx(DEV.p2p(msg / 2) + DEV.allgather(msg, 2))
    with pytest.raises(ValueError, match="layout has 3 layers"):
        DeploymentCost(arch, DEV, make_layout("loop", 3, 1), par)


def _uncached_breakdown(cost, stage, tokens, prefix) -> dict:
    """DeploymentCost.breakdown as written before its times were cached: each kind of layer's ops timed
    afresh, times its count, then the embedding, the head and the per-call terms."""
    from collections import defaultdict
    from vpp.perf.op_cache import ops_breakdown
    arch, dev, par = cost.arch, cost.device, cost.par
    out = defaultdict(float)
    for layer, n in cost.layer_kinds(stage):
        for k, v in ops_breakdown(dev, layer_ops(arch, layer, tokens, prefix, par)).items():
            out[k] += n * v
    ends = embed_ops(arch, tokens, par) if stage == 0 else []
    for ops in (ends, head_ops(arch, tokens, par) if stage == cost.layout.last_stage else []):
        for k, v in ops_breakdown(dev, ops).items():
            out[k] += v
    if dev.step_overhead:
        out["step"] += dev.step_overhead
    return dict(out)


@pytest.mark.parametrize("config", ["mla", "gqa", "dsa"])
def test_cached_stage_times_are_the_floats_computed_afresh(config):
    """Layer times cached across instances (vpp/perf/op_cache.py) give the very floats (==, not approx)
    of timing every op afresh, instance after instance, a device between them with other constants."""
    from tests.perf.archs import TINY_DSA, TINY_GQA
    cfg = {"mla": TINY_MLA, "gqa": {**TINY_GQA, "num_hidden_layers": 3}, "dsa": {**TINY_DSA, "num_hidden_layers": 4}}
    arch = Arch.from_config(cfg[config])
    par = Parallel(tp=2, weight_bytes=1)
    for device in (DEV, DEV.replace(eff_attn=0.125, step_overhead=3e-4), DEV):
        for layout in (make_layout("loop", arch.layers, 1), make_layout("loop", arch.layers, 2)):
            cost = DeploymentCost(arch, device, layout, par)
            for stage in range(layout.num_stages):
                for tokens, prefix in ((4, 0), (4, 6), (7, 100), (4, 6)):
                    want = _uncached_breakdown(cost, stage, tokens, prefix)
                    assert cost.breakdown(stage, tokens, prefix) == want
                    assert cost.compute(stage, tokens, prefix) == sum(want.values())


def test_step_overhead_and_presets():
    arch = Arch.from_config(TINY_MLA)
    cost = DeploymentCost(arch, DEV.replace(step_overhead=1e-3), make_layout("loop", 2, 1), Parallel())
    assert cost.breakdown(0, 4, 0)["step"] == 1e-3
    for name in ("910c", "h100", "h200", "cpu"):  # every preset says where each hardware figure comes from
        dev = get_device(name)
        assert all(k in dev.sources or "all" in dev.sources for k in ("peak_flops", "mem_bw", "link_bw")), name
    with pytest.raises(KeyError, match="unknown device"):
        get_device("tpu")


def test_decomposition_adds_up():
    device = ASCEND_910C.replace(eff_attn=0.5, eff_link=0.3)
    setup = Setup(Arch.from_config(get_config("deepseek")), device, Parallel(tp=8, weight_bytes=1))
    for strategy in ("cpp", "dcpp", "vpp", "vpp-async"):
        row = run(setup, strategy, [131072], 16384).row
        assert row.compute + row.bubble + row.exposed_comm == pytest.approx(row.total, rel=1e-9)
        assert row.categories["attention"] > 0
    sim = run(setup, "vpp-async", [131072], 16384)
    from vpp.perf.decompose import decompose
    a = decompose("x", sim.plan, sim.trace, sim.cost, view="simulator")
    b = decompose("x", sim.plan, sim.trace, sim.cost, view="profiler")
    assert a.total == b.total and b.bubble <= a.bubble and b.exposed_comm >= a.exposed_comm
