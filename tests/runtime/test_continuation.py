"""A cached prefix on real gloo ranks (TP 1, PP 2), against transformers on the whole sequence:

* a second turn: ``generate(..., release=False)`` leaves the prompt and all but the last new token
  in the caches; the next prompt (the first, the new tokens and more) is prefilled with
  ``cached_tokens`` set to what the caches hold and decoded on; its greedy tokens equal
  transformers' generate on that whole prompt;
* prefixes of 1 token, of index_topk (8) tokens and of 9, left by an earlier prefill, then the rest
  in ragged chunks: the last-token logits equal transformers' forward of the whole prompt (the DSA
  models' first chunk after the prefix is dense, at the boundary, or sparse).

qwen3_moe (GQA), deepseek_v32 (DSA) and glm_moe_dsa (DSA with shared indexers) as tiny Hugging Face
checkpoints of 6 layers; a V (vpp-async) and a loop (cpp). Tolerance as tests/models/test_parity.py.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow  # every test here starts processes

MODEL_TYPES = ("qwen3_moe", "deepseek_v32", "glm_moe_dsa")
SCHEDULES = ("vpp-async", "cpp")
FIRST, MORE, NEW = 20, 11, 5
CACHED = (1, 8, 9)


def _prompts():
    g = torch.Generator().manual_seed(9)
    from tests.models.hf_tiny import VOCAB
    return torch.randint(0, VOCAB, (FIRST,), generator=g), torch.randint(0, VOCAB, (MORE,), generator=g)


def _run(rank, world, cases, first, more):
    from vpp.models.registry import open_model
    from vpp.models.run_layout import layout_for
    from vpp.parallel import initialize_model_parallel
    from vpp.runtime import Pipeline

    groups = initialize_model_parallel(1, world)
    out = {}
    for key, path in cases:
        model = open_model(path)
        for schedule in SCHEDULES:
            stages = model.stages(layout_for(model, schedule, world), groups)
            pipe = Pipeline(stages, groups, timeout_s=120)
            holds_first = any(s.is_first for s in stages)
            mine = lambda ids, holds_first=holds_first: ids if holds_first else None  # noqa: E731
            turn1 = pipe.generate(mine(first), NEW, [[7, 1, FIRST - 8]], schedule=schedule, request_ids=[3],
                                  release=False).tokens[3]
            held = {st.cache_length(3) for st in stages}
            whole = torch.cat([first, torch.tensor(turn1), more])
            turn2 = pipe.generate(mine(whole), NEW, 4, schedule=schedule, request_ids=[3],
                                  cached_tokens=FIRST + NEW - 1).tokens[3]
            out[(key, schedule, "turns")] = (turn1, turn2, held)
            for c in CACHED:
                pipe.prefill(mine(first[:c]), 3, schedule=schedule)
                res = pipe.prefill(mine(first), [[2, 1, FIRST - c - 3]], schedule=schedule, cached_tokens=c)
                out[(key, schedule, c)] = pipe.next_logits(res, [0])[0]
                pipe.release(0)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory, worlds):
    from tests.models.hf_tiny import model

    first, more = _prompts()
    root = tmp_path_factory.mktemp("continuation")
    refs, cases = {}, []
    for model_type in MODEL_TYPES:
        m = model(model_type, num_hidden_layers=6)
        m.save_pretrained(root / model_type)
        cases.append((model_type, str(root / model_type)))
        with torch.no_grad():
            def greedy(ids, m=m):
                seq = m.generate(ids[None], attention_mask=torch.ones_like(ids)[None], max_new_tokens=NEW,
                                 do_sample=False, pad_token_id=0, eos_token_id=None)
                return seq[0, ids.numel():].tolist()
            turn1 = greedy(first)
            turn2 = greedy(torch.cat([first, torch.tensor(turn1), more]))
            refs[model_type] = (turn1, turn2, m(first[None]).logits[0, -1])
    return refs, worlds.run(2, _run, cases, first, more, timeout=600)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_second_turn_from_the_caches_matches_transformers(results, model_type, schedule):
    refs, per_rank = results
    turn1, turn2, _ = refs[model_type]
    for rank, res in enumerate(per_rank):
        got1, got2, held = res[(model_type, schedule, "turns")]
        assert held == {FIRST + NEW - 1}, (rank, held)  # the prompt and every new token but the last
        assert (got1, got2) == (turn1, turn2), (rank, got1, got2)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_cached_prefixes_around_index_topk_match_transformers(results, model_type, schedule):
    refs, per_rank = results
    for rank, res in enumerate(per_rank):
        for c in CACHED:
            torch.testing.assert_close(res[(model_type, schedule, c)], refs[model_type][2], atol=1e-4, rtol=1e-4,
                                       msg=lambda m, r=rank, c=c: f"rank {r}, cached_tokens={c}: {m}")
