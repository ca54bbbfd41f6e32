"""Request streams on real gloo ranks: every request's first-token logits equal its reference alone,
whether it ran alone, in a stream (sequential, packed) or under DCPP chunking; arrivals and the
concurrency gate hold in the executed trace. Tolerance as in test_executor.py (fp32 reordering)."""

import pytest
import torch

from vpp.models.registry import open_model
from vpp.parallel import ParallelGroups, initialize_model_parallel
from vpp.schedules import make_layout, request_done_times
from vpp.runtime.api import forward_prefill
from vpp.runtime.dcpp_profile import forward_dcpp_prefill, profile_planner

TOL = dict(atol=1e-5, rtol=1e-5)
LENGTHS = [40, 17, 29]
ARRIVALS = [0.0, 0.05, 0.3]


def _prompts(vocab):
    return [torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(10 + i)) for i, n in enumerate(LENGTHS)]


def _stream(rank, world, model_name):
    groups = initialize_model_parallel(1, world)
    model = open_model(model_name)
    prompts = _prompts(model.config["vocab_size"] if "vocab_size" in model.config else 512)
    out = {}
    for schedule, kind, concurrency in [("cpp", "loop", 1), ("cpp", "loop", None), ("vpp", "v", None),
                                        ("vpp-async", "v", 2), ("vpp-packed", "v", None)]:
        layout = make_layout(kind, model.num_layers, world)
        stages = [model.build(layout.stage_layers[s], groups) for s in layout.stages_of(rank)]
        holds_first = 0 in layout.stages_of(rank)
        res = forward_prefill(stages, prompts if holds_first else None, 8, groups, schedule=schedule,
                              arrivals=ARRIVALS, concurrency=concurrency, return_trace=True)
        starts = {s.request: s.start for s in res.trace.of(kind="compute") if s.stage == 0 and s.chunk == 0}
        done = request_done_times(res.trace, res.plan)
        out[(schedule, concurrency)] = (res.all_logits, starts, done)
    return out


def _reference(model_name):
    model = open_model(model_name)
    prompts = _prompts(model.config.get("vocab_size", 512))
    full = model.build((0, model.num_layers), ParallelGroups.single())
    return [full(p, q, 0, last_token_only=True)[-1] for q, p in enumerate(prompts)]


def _check(results, model_name):
    ref = _reference(model_name)
    merged = {}
    for per_rank in results:
        for key, (logits, starts, done) in per_rank.items():
            m = merged.setdefault(key, [{}, {}, {}])
            m[0].update(logits)
            m[1].update(starts)
            m[2].update(done)
    for key, (logits, starts, done) in merged.items():
        assert sorted(logits) == [0, 1, 2], key
        for q, expect in enumerate(ref):
            torch.testing.assert_close(logits[q], expect, **TOL, msg=f"{key} request {q}")
        for q, arrival in enumerate(ARRIVALS):
            if starts:
                assert starts[q] >= arrival - 1e-3, (key, q, starts[q], arrival)
    # concurrency 1 on a loop: request q+1 enters only after request q's first token exists
    _, starts, done = merged[("cpp", 1)]
    assert starts[1] >= done[0] and starts[2] >= done[1]
    # concurrency 2: request 2 waits for request 0
    _, starts, done = merged[("vpp-async", 2)]
    assert starts[2] >= done[0]
    return merged


@pytest.mark.slow
def test_streams_match_each_request_alone_toy(worlds):
    _check(worlds.run(2, _stream, "toy", timeout=120), "toy")


DCPP_LENGTHS = [900, 300]


def _dcpp(rank, world, variant):
    import vpp.runtime.dcpp_profile as dcpp_runtime
    real_timer = dcpp_runtime.stage_timer
    if variant == "sglang":
        # SGLang refuses a fit whose quadratic term is not positive, and at these sizes (<= 320 tokens
        # of a tiny model) a loaded CPU's noise can outweigh attention's quadratic growth: time the
        # profile with a clean quadratic instead (vLLM-Ascend's run below profiles the real stage).
        dcpp_runtime.stage_timer = lambda stage, groups, seed=0: (lambda n: 1e-3 + 2e-5 * n + 1e-7 * n * n)
    try:
        return _dcpp_run(rank, world, variant)
    finally:  # the ranks serve later cases (tests/worlds.py): put the real timer back
        dcpp_runtime.stage_timer = real_timer


def _dcpp_run(rank, world, variant):
    groups = initialize_model_parallel(1, world)
    model = open_model("tiny-deepseek")
    prompts = [torch.randint(0, 2048, (n,), generator=torch.Generator().manual_seed(n)) for n in DCPP_LENGTHS]
    layout = make_layout("loop", model.num_layers, world)
    stages = [model.build(layout.stage_layers[s], groups) for s in layout.stages_of(rank)]
    planner = profile_planner(stages, groups, 256, variant=variant)
    res = forward_dcpp_prefill(stages, prompts if rank == 0 else None, 256, groups, planner=planner)
    chunkings = [list(q.chunk_sizes) for q in res.plan.requests]
    assert chunkings == [planner.chunk_sizes(n) for n in DCPP_LENGTHS]
    return res.all_logits, chunkings, (planner.a, planner.b, planner.c)


@pytest.mark.slow
def test_dcpp_on_real_ranks_matches_the_reference(worlds):
    model = open_model("tiny-deepseek")
    full = model.build((0, model.num_layers), ParallelGroups.single())
    prompts = [torch.randint(0, 2048, (n,), generator=torch.Generator().manual_seed(n)) for n in DCPP_LENGTHS]
    ref = [full(p, q, 0, last_token_only=True)[-1] for q, p in enumerate(prompts)]
    for variant in ("vllm-ascend", "sglang"):
        results = worlds.run(2, _dcpp, variant, timeout=300)
        # every rank planned with the same (broadcast) fit, so the same chunks
        assert results[0][1] == results[1][1] and results[0][2] == results[1][2]
        logits = {**results[0][0], **results[1][0]}
        for q, expect in enumerate(ref):
            torch.testing.assert_close(logits[q], expect, **TOL, msg=f"dcpp {variant} request {q}")
        for sizes, n in zip(results[0][1], DCPP_LENGTHS):
            assert sum(sizes) == n and sizes[0] == 256
            assert all(x >= y for x, y in zip(sizes[:-2], sizes[1:-1])), sizes  # chunks never grow


@pytest.mark.slow
def test_streams_match_each_request_alone_tiny_deepseek(worlds):
    _check(worlds.run(2, _stream, "tiny-deepseek", timeout=300), "tiny-deepseek")


def test_real_stages_declare_their_positions_for_the_prompt_check():
    from vpp.runtime.handshake import check_prompt, describe_stage
    model = open_model("tiny-deepseek")
    info = describe_stage(model.build((0, 2), ParallelGroups.single()))
    assert info.max_positions == model.config["max_position_embeddings"] == 2 ** 20  # 1M: long prompts run as is
    too_long = torch.zeros(2 ** 20 + 1, dtype=torch.long)
    assert check_prompt(too_long, info) == "prompt has 1048577 tokens, more than the model's 1048576 positions"
    assert check_prompt(too_long[:100], info) is None
