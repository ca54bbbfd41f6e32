"""Steps shared by requests on real gloo ranks: each request's first-token logits equal its reference
alone for CPP, VPP and VPP-Async (loop, V and a V whose hops are local and remote), and each step
crosses each remote hop as one message (the trace's send spans are per step). Tolerance as in
test_streams.py (fp32 reordering)."""

import pytest
import torch

from vpp.models.registry import open_model
from vpp.parallel import ParallelGroups, initialize_model_parallel
from vpp.schedules import make_layout
from vpp.schedules.shared_budget import shared_budget_stream
from vpp.runtime.api import forward_prefill

TOL = dict(atol=1e-5, rtol=1e-5)
LENGTHS = [13, 30, 9, 21]
BUDGET = 16


def _prompts(vocab):
    return [torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(30 + i)) for i, n in enumerate(LENGTHS)]


def _run(rank, world, model_name):
    groups = initialize_model_parallel(1, world)
    model = open_model(model_name)
    prompts = _prompts(model.config.get("vocab_size", 512))
    requests, steps = shared_budget_stream(LENGTHS, BUDGET)
    sizes = [list(q.chunk_sizes) for q in requests]
    out = {}
    for schedule, kind in [("cpp", "loop"), ("vpp", "v"), ("vpp-async", "v")]:
        layout = make_layout(kind, model.num_layers, world)
        stages = [model.build(layout.stage_layers[s], groups) for s in layout.stages_of(rank)]
        res = forward_prefill(stages, prompts if 0 in layout.stages_of(rank) else None, sizes, groups,
                              schedule=schedule, steps=steps, return_trace=True)
        sends = {(s.stage, s.request, s.chunk) for s in res.trace.of(kind="send")}
        out[schedule] = (res.all_logits, len(sends), len(res.plan.steps), len(steps))
    return out


@pytest.mark.slow
def test_shared_steps_match_each_request_alone_toy(worlds):
    results = worlds.run(2, _run, "toy", timeout=120)
    model = open_model("toy")
    full = model.build((0, model.num_layers), ParallelGroups.single())
    ref = [full(p, q, 0, last_token_only=True)[-1] for q, p in enumerate(_prompts(model.config.get("vocab_size", 512)))]
    for schedule in ("cpp", "vpp", "vpp-async"):
        logits = {}
        for per_rank in results:
            logits.update(per_rank[schedule][0])
        assert sorted(logits) == list(range(len(LENGTHS))), schedule
        for q, expect in enumerate(ref):
            torch.testing.assert_close(logits[q], expect, **TOL, msg=f"{schedule} request {q}")
        _, n_sends, n_shared, n_steps = results[0][schedule]
        assert n_shared >= 2
        # the gathered trace: one send per step and remote hop: loop (1 hop), V on 2 ranks (2 remote hops)
        hops = 1 if schedule == "cpp" else 2
        assert n_sends == n_steps * hops, (schedule, n_sends, n_steps)
