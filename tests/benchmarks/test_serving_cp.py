"""Paper-scale streams (benchmarks.paper.serving) and the CP comparison harness (benchmarks.cp_compare) on tiny
deployments."""

import pytest

from benchmarks.cp_compare import META_POINTS, anchor, deployments, evaluate, meta_points
from benchmarks.paper.serving import best_budget, gain, serve
from vpp.perf.arch import Arch
from vpp.perf.configs import LLAMA3_405B, get_arch
from vpp.perf.cp import full_prefill
from vpp.perf.hardware import H100
from vpp.perf.ops import Parallel
from vpp.perf.runs import Setup, run
from vpp.schedules.workloads import Workload

from tests.perf.archs import DEV, TINY_GQA, TINY_MLA


def tiny_setup() -> Setup:
    return Setup(Arch.from_config({**TINY_MLA, "num_hidden_layers": 4}), DEV, Parallel(tp=2, weight_bytes=1), 2)


def test_serve_measures_the_stream_it_simulates():
    setup = tiny_setup()
    w = Workload("w", (2048, 512, 4096), (0.0, 0.0, 0.0), 2)
    rows = {s: serve(setup, w, s, 512) for s in ("cpp", "dcpp", "vpp-async", "vpp-packed")}
    for r in rows.values():
        assert r.stats.tokens == 6656 and r.stats.throughput == pytest.approx(6656 / r.stats.makespan)
        assert r.stats.ttft_median <= r.stats.ttft_p90
    assert rows["cpp"].chunks == 4 + 1 + 8
    assert gain(rows, "cpp") == pytest.approx(rows["vpp-packed"].stats.throughput / rows["cpp"].stats.throughput - 1)
    best = best_budget(setup, w, "cpp", (256, 512, 1024))
    assert best.stats.throughput == max(serve(setup, w, "cpp", c).stats.throughput for c in (256, 512, 1024))


def test_deployments_spend_every_device():
    deps = deployments(get_arch("deepseek"), DEV, devices=16)
    names = [d.name for d in deps]
    assert names == ["CPP", "DCPP", "VPP-Async", "CP2", "CP4", "CP8", "CP16", "VPP-Async x CP2", "VPP-Async x CP4"]
    for d in deps:
        assert d.setup.devices == 16
    assert {d.shape for d in deps if d.name.startswith("VPP-Async x")} == {"TP4 x PP2 x CP2", "TP2 x PP2 x CP4"}
    assert all(d.setup.cp == 1 for d in deployments(get_arch("glm"), DEV, devices=16))   # no CP for DSA


def test_evaluate_takes_the_best_budget_and_checks_memory():
    arch = Arch.from_config({**TINY_GQA, "num_hidden_layers": 4})
    dep = [d for d in deployments(arch, DEV.replace(mem_bytes=1e12), devices=4, weight_bytes=2) if d.name == "CP2"][0]
    out = evaluate(dep, 4096, chunks=(256, 512, 1024))
    direct = min(run(dep.setup, "cpp", [4096], c * 2).row.total for c in (256, 512, 1024))
    assert out.ttft == pytest.approx(direct) and out.fits
    tight = [d for d in deployments(arch, DEV.replace(mem_bytes=1.0), devices=4, weight_bytes=2) if d.name == "CP2"][0]
    assert not evaluate(tight, 4096, chunks=(256,)).fits


def test_anchor_is_the_full_prefill_of_the_modelled_setup():
    a = anchor(tokens=1 << 16)
    par = Parallel(tp=8, weight_bytes=1)
    assert a["ttft_s"] == pytest.approx(full_prefill(LLAMA3_405B, H100, par, 16, 1 << 16))
    assert a["efficiency"] == pytest.approx(full_prefill(LLAMA3_405B, H100, par, 1, 1 << 16) / (16 * a["ttft_s"]))
    assert 0 < a["efficiency"] <= 1.0 and a["name"] == "llama3-405b-1m-128xh100"


def test_every_meta_point_is_the_full_prefill_of_its_shape():
    rows = meta_points()
    assert [r["name"] for r in rows] == [p["name"] for p in META_POINTS] and rows[0]["seconds"] == 77.0
    par = Parallel(tp=8, weight_bytes=1)
    for r in rows:
        t = full_prefill(LLAMA3_405B, H100, par, r["cp"], r["tokens"])
        assert r["model_s"] == pytest.approx(t) and r["error"] == pytest.approx(t / r["seconds"] - 1)
        assert r["within"] == (abs(t / r["seconds"] - 1) <= 0.15)
        if r["cp"] > 1:   # the gap spread over (cp - 1) x 126 ring steps
            assert r["needed_step_ms"] == pytest.approx(1e3 * (r["seconds"] - t) / ((r["cp"] - 1) * 126))


def test_deployments_carry_the_kv_format():
    assert {d.setup.par.kv_bytes for d in deployments(get_arch("deepseek"), DEV, devices=16, kv_bytes=1)} == {1}


def test_shared_budget_in_the_streams():
    # budget 1024 over 2048, 512, 4096 tokens: r0 two full steps; r1's 512 shares a step with 512 of r2,
    # whose 3584 left are 3 full steps and 512: 2 + 1 + 5 pieces (one prompt per step: 2 + 1 + 4)
    setup = tiny_setup()
    w = Workload("w", (2048, 512, 4096), (0.0, 0.0, 0.0), 3)
    shared = setup.replace(shared_budget=True)
    assert serve(setup, w, "cpp", 1024).chunks == 7
    r = serve(shared, w, "cpp", 1024)
    assert r.chunks == 8 and r.stats.tokens == 6656


def test_shared_budget_dcpp_calibrates_on_each_step():
    from vpp.perf.runs import dcpp_chunking
    from vpp.schedules.shared_budget import shared_budget_steps

    setup = tiny_setup().replace(shared_budget=True)
    layout = setup.layout("loop")
    cost = setup.cost(layout, "dcpp")
    lengths = [6000, 700, 9000]
    reqs = dcpp_chunking(setup, lengths, 2048, cost, layout)
    assert [sum(q.chunk_sizes) for q in reqs] == lengths
    # synced shapes: one per timed step, each a step's first piece (a request's chunk at its offset)
    pieces = {(n, q.offset(c)) for q in reqs for c, n in enumerate(q.chunk_sizes)}
    assert cost.sync_only and cost.sync_only <= pieces
    # without online calibration the steps are the offline planner's shared-budget steps
    off = setup.replace(dcpp_online=False)
    reqs_off = dcpp_chunking(off, lengths, 2048, off.cost(layout, "dcpp"), layout)
    from vpp.schedules.dcpp import DcppPlanner, profiled_stages, stage_measure
    p = DcppPlanner(setup.dcpp_variant, budget=2048, online=False)
    p.profile(stage_measure(off.cost(layout, "dcpp"), profiled_stages(layout, setup.dcpp_variant)))
    sizes = [[] for _ in lengths]
    for step in shared_budget_steps(lengths, 2048, planner=p):
        assert sum(n for _, n in step) <= 2048
        for q, n in step:
            sizes[q].append(n)
    assert [list(q.chunk_sizes) for q in reqs_off] == sizes


def test_packing_estimate_switch():
    from vpp.schedules import simulate_plan, strategies
    from vpp.schedules.stream import stream_stats

    setup = tiny_setup().replace(packing_estimate="eq2")
    w = Workload("w", (512, 512, 512, 512), (0.0,) * 4, 4)
    r = serve(setup, w, "vpp-packed", 512)
    layout = setup.layout("v")
    cost = setup.cost(layout, "vpp-packed")
    plan = strategies.get("vpp-packed").plan(layout, w.requests(512), concurrency=4, cost=None)
    assert r.stats.makespan == pytest.approx(stream_stats(simulate_plan(plan, cost, check=False), plan).makespan)
    with pytest.raises(ValueError, match="packing_estimate"):
        tiny_setup().replace(packing_estimate="x").cost(layout)
