"""Prompts with a cached prefix on real gloo ranks: the first N tokens' caches are left by an earlier
prefill or installed with ``import_cache``, the rest is prefilled with ``cached_tokens=N``; the
last-token logits equal an unpipelined forward of the whole prompt (the reference: the full model in
one process), on a V (vpp-async) and under DCPP, whose first chunk is sized for the prefix. A wrong
count is one error on every rank. Tolerance as in test_streams.py (fp32 reordering)."""

import pytest
import torch

from vpp.models.registry import open_model
from vpp.parallel import ParallelGroups, initialize_model_parallel
from vpp.schedules import make_layout
from vpp.schedules.dcpp import DcppPlanner
from vpp.runtime import Pipeline

TOL = dict(atol=1e-5, rtol=1e-5)
LENGTH, CACHED = 300, 130


def _prompt(vocab):
    return torch.randint(0, vocab, (LENGTH,), generator=torch.Generator().manual_seed(5))


def _run(rank, world):
    groups = initialize_model_parallel(1, world)
    model = open_model("tiny-qwen")
    ids = _prompt(model.config["vocab_size"])
    out = {}
    for schedule, kind in (("vpp-async", "v"), ("dcpp", "loop")):
        layout = make_layout(kind, model.num_layers, world)
        stages = [model.build(layout.stage_layers[s], groups) for s in layout.stages_of(rank)]
        first = 0 in layout.stages_of(rank)
        pipe = Pipeline(stages, groups)
        chunking = 48
        if schedule == "dcpp":   # a clean quadratic profile: the chunks shrink with the prefix
            planner = DcppPlanner("vllm-ascend", budget=128, min_chunk=8, online=False)
            chunking = planner.fit(list(range(8, 72, 8)), [1e-3 + 1e-5 * n + 1e-6 * n * n for n in range(8, 72, 8)]).chunk_sizes
        # left by an earlier prefill of the prefix
        pipe.prefill(ids[:CACHED] if first else None, chunking, schedule=schedule)
        res = pipe.prefill(ids if first else None, chunking, schedule=schedule, cached_tokens=CACHED)
        out[(schedule, "left")] = (res.all_logits, [list(q.chunk_sizes) for q in res.plan.requests],
                                   [q.cached for q in res.plan.requests])
        # exported, released, imported again
        pipe.prefill(ids[:CACHED] if first else None, chunking, schedule=schedule, request_ids=[7])
        saved = pipe.export_cache(7)
        pipe.release(7)
        pipe.import_cache(7, saved)
        res = pipe.prefill(ids if first else None, chunking, schedule=schedule, cached_tokens=CACHED,
                           request_ids=[7])
        out[(schedule, "imported")] = ({0: v for v in res.all_logits.values()}, None, None)
        try:    # the caches hold CACHED tokens of request 7 now... plus the rest: a wrong count
            pipe.prefill(ids if first else None, chunking, schedule=schedule, cached_tokens=CACHED, request_ids=[7])
        except ValueError as exc:
            out[(schedule, "error")] = str(exc)
        for q in (0, 7):
            pipe.release(q)
    return out


@pytest.mark.slow
def test_cached_prefix_equals_a_full_forward(worlds):
    model = open_model("tiny-qwen")
    ids = _prompt(model.config["vocab_size"])
    full = model.build((0, model.num_layers), ParallelGroups.single())
    ref = full(ids, 0, 0, last_token_only=True)[-1]
    results = worlds.run(2, _run, timeout=300)
    for schedule in ("vpp-async", "dcpp"):
        for how in ("left", "imported"):
            logits = {**results[0][(schedule, how)][0], **results[1][(schedule, how)][0]}
            torch.testing.assert_close(logits[0], ref, **TOL, msg=f"{schedule} {how}")
        sizes, cached = results[0][(schedule, "left")][1:]
        assert cached == [CACHED] and sum(sizes[0]) == LENGTH - CACHED
        errors = {results[0][(schedule, "error")], results[1][(schedule, "error")]}
        assert len(errors) == 1 and f"cached_tokens={CACHED}, but stage" in errors.pop()
    dcpp = results[0][("dcpp", "left")][1][0]
    planner = DcppPlanner("vllm-ascend", budget=128, min_chunk=8, online=False)
    planner.fit(list(range(8, 72, 8)), [1e-3 + 1e-5 * n + 1e-6 * n * n for n in range(8, 72, 8)])
    assert dcpp == planner.chunk_sizes(LENGTH - CACHED, cached=CACHED) and dcpp[0] == 64   # sized for the prefix (x* = 54.4, up to 64)
