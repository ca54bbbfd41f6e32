"""A step shared by requests as one forward (vpp/perf/batched.py): checked against the step's cost
computed here from the op lists and the device, layer by layer of the layout, attention named by hand."""

import pytest

from benchmarks.paper.serving import serve
from vpp.perf.arch import Arch
from vpp.perf.batched import piece_times, step_parts
from vpp.perf.deployment import DeploymentCost
from vpp.perf.ops import Parallel, embed_ops, head_ops, layer_ops
from vpp.perf.runs import Setup
from vpp.schedules import make_layout, simulate_plan, strategies
from vpp.schedules.shared_budget import shared_budget_stream
from vpp.schedules.workloads import Workload

from tests.perf.archs import DEV, TINY_DSA, TINY_GQA, TINY_MLA

# the ops that run over a request's own prefix (vLLM's variable-length attention and what feeds it)
ATTENTION = {"attention", "attention_merge", "prefix_gather", "prefix_kv_up", "prefix_slice", "index_scores",
             "index_topk", "sparse_attention"}
PAR = Parallel(tp=2, weight_bytes=1)
STEPPED = DEV.replace(step_overhead=3e-4, host_step=5e-4)
CONFIGS = {"mla": TINY_MLA, "gqa": TINY_GQA, "dsa": {**TINY_DSA, "num_hidden_layers": 4}}


def cost_of(config, *, batched=True, device=STEPPED, **kw):
    arch = Arch.from_config(config)
    return DeploymentCost(arch, device, make_layout("loop", arch.layers, 2), PAR, batched_steps=batched, **kw)


def expected_step(cost, stage, shapes, *, stall=False):
    """One forward on the step's tokens: every non-attention op of every layer of the stage once at the
    total, each piece's attention ops at its own (tokens, prefix), each attention kernel launched once."""
    arch, dev = cost.arch, cost.device
    total = sum(t for t, _ in shapes)
    t = 0.0
    for layer in cost.layout.layers_of(stage):
        t += sum(dev.op_time(op) for op in layer_ops(arch, layer, total, 0, PAR) if op.name not in ATTENTION)
        kernels = {}
        for c, p in shapes:
            for op in layer_ops(arch, layer, c, p, PAR):
                if op.name in ATTENTION:
                    t += dev.op_time(op) - op.kernels * dev.kernel_overhead
                    kernels[op.name] = max(kernels.get(op.name, 0), op.kernels)
        t += sum(kernels.values()) * dev.kernel_overhead
    if stage == 0:
        t += sum(dev.op_time(op) for op in embed_ops(arch, total, PAR))
    if stage == cost.layout.last_stage:          # logits of each piece's last token
        t += sum(dev.op_time(op) for op in head_ops(arch, total, PAR, requests=len(shapes)))
    return t + dev.step_overhead + (dev.host_step if stall else 0.0)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("shapes", [[(5, 7), (3, 0)], [(6, 0), (2, 0), (9, 4)], [(1, 30), (4, 2)]])
def test_a_batched_step_costs_one_forward_on_its_tokens(name, shapes):
    cost = cost_of(CONFIGS[name])
    for stage in range(cost.layout.num_stages):
        want = expected_step(cost, stage, shapes)
        shared, own = step_parts(cost, stage, shapes)
        assert sum(shared.values()) + sum(sum(o.values()) for o in own) == pytest.approx(want, rel=1e-12)
        times = cost.step_compute(stage, shapes)
        assert sum(times) == pytest.approx(want, rel=1e-12), (name, stage, shapes, times, want)
        # each piece: its own attention (no launches) plus its token share of the rest
        rest = want - sum(sum(o.values()) for o in own)
        total = sum(t for t, _ in shapes)
        for got, o, (t, p) in zip(times, own, shapes):
            attn = sum(DEV.op_time(op) - op.kernels * DEV.kernel_overhead for layer in cost.layout.layers_of(stage)
                       for op in layer_ops(cost.arch, layer, t, p, PAR) if op.name in ATTENTION)
            assert sum(o.values()) == pytest.approx(attn, rel=1e-12)
            assert got == pytest.approx(attn + rest * t / total, rel=1e-12)


def _uncached_step_parts(cost, stage, shapes):
    """step_parts as written before its layer parts were cached: every op timed afresh, in the same order."""
    from collections import defaultdict
    from vpp.perf.op_cache import ops_breakdown
    arch, par, dev = cost.arch, cost.par, cost.device
    total = sum(t for t, _ in shapes)
    shared, own = defaultdict(float), [defaultdict(float) for _ in shapes]
    for layer, n in cost.layer_kinds(stage):
        once = [op for op in layer_ops(arch, layer, total, 0, par) if not op.per_request]
        for k, v in ops_breakdown(dev, once).items():
            shared[k] += n * v
        kernels = {}
        for i, (t, p) in enumerate(shapes):
            for op in layer_ops(arch, layer, t, p, par):
                if op.per_request:
                    own[i][op.category] += n * (dev.op_time(op) - op.kernels * dev.kernel_overhead)
                    kernels[op.name] = max(kernels.get(op.name, 0), op.kernels)
        shared["launch"] += n * sum(kernels.values()) * dev.kernel_overhead
    ends = (embed_ops(arch, total, par) if stage == 0 else []), \
        (head_ops(arch, total, par, requests=len(shapes)) if stage == cost.layout.last_stage else [])
    for ops in ends:
        for k, v in ops_breakdown(dev, ops).items():
            shared[k] += v
    shared["step"] += dev.step_overhead
    return dict(shared), [dict(o) for o in own]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cached_step_parts_are_the_floats_computed_afresh(name):
    """The batched step's layer parts, cached across steps and instances (vpp/perf/op_cache.py), are the
    very floats (==) of timing every op afresh, on two devices in turn."""
    for device in (STEPPED, STEPPED.replace(eff_attn=0.125), STEPPED):
        cost = cost_of(CONFIGS[name], device=device)
        for stage in range(2):
            for shapes in ([(5, 7), (3, 0)], [(6, 0), (2, 0), (9, 4)], [(5, 7), (3, 0)]):
                assert step_parts(cost, stage, shapes) == _uncached_step_parts(cost, stage, shapes)


def test_only_attention_and_its_prefix_work_are_per_request_and_the_rest_ignores_the_prefix():
    for config in CONFIGS.values():
        arch = Arch.from_config(config)
        for layer in range(arch.layers):
            for c, p in ((5, 0), (5, 9), (7, 40)):
                ops = layer_ops(arch, layer, c, p, PAR)
                assert {op.name for op in ops if op.per_request} == {op.name for op in ops} & ATTENTION
                assert [op for op in ops if not op.per_request] == \
                       [op for op in layer_ops(arch, layer, c, 0, PAR) if not op.per_request]


def test_a_synced_step_pays_the_stall_once_by_its_lead():
    cost = cost_of(TINY_MLA, sync_steps=True, sync_only={(5, 7)})
    shapes = [(5, 7), (3, 0)]
    assert sum(cost.step_compute(0, shapes)) == pytest.approx(expected_step(cost, 0, shapes, stall=True), rel=1e-12)
    assert sum(cost.step_compute(0, shapes[::-1])) == pytest.approx(expected_step(cost, 0, shapes[::-1]), rel=1e-12)
    every = cost_of(TINY_MLA, sync_steps=True)
    assert sum(every.step_compute(1, shapes)) == pytest.approx(expected_step(every, 1, shapes, stall=True), rel=1e-12)


def test_batching_never_costs_more_than_separate_calls():
    for config in CONFIGS.values():
        on, off = cost_of(config), cost_of(config, batched=False)
        for shapes in ([(5, 7), (3, 0)], [(64, 0), (64, 64), (16, 200)]):
            for stage in (0, 1):
                assert sum(on.step_compute(stage, shapes)) < sum(off.step_compute(stage, shapes))


def test_off_is_one_call_per_piece_with_the_overhead_paid_once():
    cost = cost_of(TINY_MLA, batched=False)
    shapes = [(5, 7), (3, 0), (4, 11)]
    for stage in (0, 1):
        want = [cost.compute(stage, 5, 7), cost.compute(stage, 3, 0) - STEPPED.step_overhead,
                cost.compute(stage, 4, 11) - STEPPED.step_overhead]
        assert cost.step_compute(stage, shapes) == want          # exactly today's arithmetic


def test_a_lone_piece_is_its_own_call_either_way():
    for config in CONFIGS.values():
        on = cost_of(config)
        for stage in (0, 1):
            assert on.step_compute(stage, [(6, 9)]) == [on.compute(stage, 6, 9)]
            # and the batched formula itself degenerates to the one call
            assert piece_times(on, stage, [(6, 9)]) == [pytest.approx(on.compute(stage, 6, 9), rel=1e-12)]


def test_the_simulator_gives_each_piece_its_share():
    arch = Arch.from_config({**TINY_MLA, "num_hidden_layers": 4})
    layout = make_layout("v", 4, 2)
    requests, steps = shared_budget_stream([700, 300, 500, 900], 1024)
    for batched in (True, False):
        cost = DeploymentCost(arch, STEPPED, layout, PAR, batched_steps=batched)
        plan = strategies.get("vpp-async").plan(layout, requests, steps=steps)
        trace = simulate_plan(plan, cost)
        by_id = {q.id: q for q in requests}
        spans = {(s.stage, s.request, s.chunk): s.end - s.start for s in trace.spans if s.kind == "compute"}
        for g in steps:
            shapes = [(by_id[q].tokens(c), by_id[q].offset(c)) for q, c in g]
            for stage in range(layout.num_stages):
                if len(g) > 1:
                    want = cost.step_compute(stage, shapes)
                else:
                    want = [cost.compute(stage, *shapes[0])]
                got = [spans[(stage, q, c)] for q, c in g]
                assert got == pytest.approx(want, rel=1e-9, abs=1e-15), (batched, stage, g)


def stream_setup(**kw):
    return Setup(Arch.from_config({**TINY_MLA, "num_hidden_layers": 4}), STEPPED, PAR, 2, shared_budget=True, **kw)


def test_a_stream_of_one_request_per_step_is_unchanged():
    w = Workload("w", (1024, 2048, 1024), (0.0,) * 3, 3)   # every prompt a multiple of the budget
    assert all(len(g) == 1 for g in shared_budget_stream(w.lengths, 1024)[1])
    for strategy in ("cpp", "dcpp", "vpp-async"):
        on, off = serve(stream_setup(batched_steps=True), w, strategy, 1024), serve(stream_setup(), w, strategy, 1024)
        assert on.stats.makespan == off.stats.makespan and on.stats.ttft == off.stats.ttft, strategy


def test_batched_streams_run_faster_where_steps_are_shared():
    w = Workload("w", (300, 500, 200, 700, 100), (0.0,) * 5, 5)
    for strategy in ("cpp", "dcpp", "vpp-async"):
        on, off = serve(stream_setup(batched_steps=True), w, strategy, 1024), serve(stream_setup(), w, strategy, 1024)
        assert on.stats.makespan < off.stats.makespan, strategy


def test_dcpp_calibrates_on_the_batched_step_time(monkeypatch):
    from vpp.perf.runs import dcpp_chunking
    from vpp.schedules.dcpp import DcppPlanner, profiled_stages

    seen = []
    observe = DcppPlanner.observe_step
    monkeypatch.setattr(DcppPlanner, "observe_step", lambda self, shapes, t: (seen.append((list(shapes), t)),
                                                                               observe(self, shapes, t))[1])
    setup = stream_setup(batched_steps=True)
    layout = setup.layout("loop")
    cost = setup.cost(layout, "dcpp")
    dcpp_chunking(setup, [3000, 700, 400, 5000], 2048, cost, layout, with_steps=True)
    stages = profiled_stages(layout, setup.dcpp_variant)
    shared = [(shapes, t) for shapes, t in seen if len(shapes) > 1]
    assert shared, seen
    for shapes, t in shared:      # each timed step synced once, before its first piece
        assert t == pytest.approx(sum(expected_step(cost, s, shapes, stall=True) for s in stages), rel=1e-12)


def test_context_parallel_batched_steps_are_refused():
    layout = make_layout("loop", 4, 2)
    with pytest.raises(ValueError, match="cp=2"):
        stream_setup(batched_steps=True, cp=2).cost(layout)
