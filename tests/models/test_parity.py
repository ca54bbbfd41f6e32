"""Chunked prefill with vpp's stages equals transformers' single full forward, for qwen3_moe,
deepseek_v3, deepseek_v32 and glm_moe_dsa (tiny random models saved with ``save_pretrained``).

Covered: chunk sizes 37 (whole prompt), 16 and 7 (ragged last chunk) and 1; logits at every position
and the last token alone; TP = 1 in this process, TP = 2 on two spawned ranks with the experts
TP-sharded (ep = 1) and spread over the ranks (ep = 2, both MoE dispatch modes; one token at a time on
one of these layouts per family, rotating: ``tests.models.tp2.chunks_at_tp2``); two requests
interleaved chunk by chunk on the same modules; a model split into pipeline stages. DSA models use
index_topk = 8 < prompt, so chunks past the 8th token take the sparse (gathered top-k) path, and
GLM's shared-indexer layers reuse the previous layer's selection.

Tolerance (fp32): the same products summed in different orders -- a chunk's attention against a
cached prefix instead of one causal pass, MLA's weight-absorbed sparse path instead of expanded
K/V, TP partial sums added by all-reduce, expert contributions in another order. Logits are O(1-5)
and the observed differences are ~2e-6 to 4e-6; ``atol=rtol=1e-4`` leaves a 25x margin and stays
~1e4x below a real bug (a wrong mask, RoPE, selection or shard moves logits by O(0.1-1): attending
densely instead of to the top-k changes them by ~4). Router and indexer gaps in these models are
far above 1e-6, so no top-k selection flips on rounding.
"""

from __future__ import annotations

import pytest
import torch

from tests.models.tp2 import CHUNKS, MODEL_TYPES, MOE_LAYOUTS, chunks_at_tp2, interleaved, prefill
from vpp.models import load_stage, stage_starts
from vpp.parallel import ParallelGroups

TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def single_stages(hf_cases):
    return {t: load_stage(c.path, (0, 4), ParallelGroups.single()) for t, c in hf_cases.items()}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_chunked_prefill_matches_transformers_tp1(model_type, hf_cases, single_stages):
    case, stage = hf_cases[model_type], single_stages[model_type]
    ids, ref = case.prompts["a"], case.logits["a"]
    for chunk in CHUNKS:
        torch.testing.assert_close(prefill(stage, ids, "a", chunk), ref, **TOL, msg=f"chunk {chunk}")
        assert stage.cache_length("a") == len(ids) and stage.requests() == ["a"]
        stage.release("a")
        assert stage.cache_length("a") == 0 and stage.requests() == []
    last = [stage(ids[s:s + 16], "a", s, last_token_only=True) for s in range(0, len(ids), 16)]
    stage.release("a")
    assert last[-1].shape == (1, stage.vocab_size)
    torch.testing.assert_close(last[-1][0], ref[-1], **TOL)
    torch.testing.assert_close(last[0][0], ref[15], **TOL)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_interleaved_requests_equal_each_alone_tp1(model_type, hf_cases, single_stages):
    case, stage = hf_cases[model_type], single_stages[model_type]
    alone = {}
    for name, ids in case.prompts.items():
        alone[name] = prefill(stage, ids, name, 5)
        stage.release(name)
    both = interleaved(stage, case.prompts, 5)
    assert sorted(stage.requests()) == ["a", "b"]
    for name in case.prompts:
        assert torch.equal(both[name], alone[name]), name  # the same computation, bit for bit
        torch.testing.assert_close(both[name], case.logits[name], **TOL)
        stage.release(name)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_pipeline_stages_chain_tp1(model_type, hf_cases):
    case = hf_cases[model_type]
    ids, ref = case.prompts["a"], case.logits["a"]
    starts = stage_starts(case.path)
    bounds = starts + [4]
    stages = [load_stage(case.path, (a, b), ParallelGroups.single()) for a, b in zip(bounds, bounds[1:])]
    assert [s.is_first for s in stages] == [True] + [False] * (len(stages) - 1)
    assert [s.is_last for s in stages] == [False] * (len(stages) - 1) + [True]
    names = {n for n, _ in stages[-1].named_parameters()}
    assert "lm_head.weight" in names and f"model.layers.{bounds[-2]}.input_layernorm.weight" in names
    outs = []
    for s in range(0, len(ids), 7):
        h = ids[s:s + 7]
        for stage in stages:
            h = stage(h, "a", s)
            assert h.shape == (len(ids[s:s + 7]), stage.vocab_size if stage.is_last else stage.hidden_size)
        outs.append(h)
    torch.testing.assert_close(torch.cat(outs), ref, **TOL)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("ep,dispatch", MOE_LAYOUTS)
def test_chunked_prefill_matches_transformers_tp2(model_type, ep, dispatch, tp2_results):
    for rank, res in enumerate(tp2_results):
        chunks = chunks_at_tp2(model_type, (ep, dispatch))
        assert {k[-1] for k in res if k[:4] == (model_type, ep, dispatch, "chunk")} == set(chunks)
        for chunk in chunks:
            error = res[(model_type, ep, dispatch, "chunk", chunk)]
            assert error < 1e-4, f"rank {rank}, chunk {chunk}: max abs error {error:.2e}"
        error = res[(model_type, ep, dispatch, "interleaved")]
        assert error < 1e-4, f"rank {rank}, two interleaved requests: max abs error {error:.2e}"
        assert res[(model_type, ep, dispatch, "released")] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_pipeline_stages_chain_tp2(model_type, tp2_results):
    for res in tp2_results:
        assert res[(model_type, "pipeline")] < 1e-4


def test_one_token_chunks_reach_every_family_and_moe_layout_at_tp2():
    ones = {(t, layout) for t in MODEL_TYPES for layout in MOE_LAYOUTS if 1 in chunks_at_tp2(t, layout)}
    assert {t for t, _ in ones} == set(MODEL_TYPES) and {layout for _, layout in ones} == set(MOE_LAYOUTS)
    assert all(set(chunks_at_tp2(t, layout)) >= set(CHUNKS) - {1} for t in MODEL_TYPES for layout in MOE_LAYOUTS)
