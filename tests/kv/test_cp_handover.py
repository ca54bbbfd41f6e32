"""Prefill here with context parallelism, decode there: a CP2 x PP2 prefill instance (VPP-Async, each
stage on a CP group of 2 ranks, every KV cache sharded over them) hands its request over to a TP2
decode instance, in one world of 6 gloo ranks.

Each decode rank receives its layers and heads of every CP shard and puts the rows at their tokens,
so it holds every token in order: greedy tokens equal transformers' ``generate`` (tiny Hugging Face
checkpoints of 6 layers: Qwen3-MoE, its one KV head replicated at TP 2; GLM-5, MLA's latent and the
DSA indexer's keys, some layers sharing another's top-k). The bytes each
decode rank receives equal its caches' size from the config (closed form: every token once, no
padding), and the prefill ranks send exactly what the decode ranks receive.
"""

from __future__ import annotations

import pytest
import torch

from tests.kv.test_handover import _cache_bytes_per_token


NEW = 6
FAMILIES = ("qwen3_moe", "glm_moe_dsa")  # K/V sliced by heads; MLA latent + DSA indexer keys (shared ones)
PROMPT = 37  # chunks of 8: 8, 8, 8, 8, 5 (the last ragged: the CP ranks hold 18 and 19 rows)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    from tests.models.hf_tiny import VOCAB, saved_with_greedy

    root = tmp_path_factory.mktemp("cp-handover")
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(3))
    out = saved_with_greedy(root, FAMILIES, prompt, NEW, num_hidden_layers=6)
    return prompt, out


def _world(rank, world, cases, prompt):
    from vpp.models.registry import open_model
    from vpp.models.run_layout import layout_for
    from vpp.parallel import ParallelGroups
    from vpp.parallel.instances import initialize_disaggregated
    from vpp.runtime import Pipeline, Sampler
    from vpp.kv.handover import hand_over

    link = initialize_disaggregated(1, 2, 2, 1, prefill_cp=2)
    out = {}
    for name, path in cases.items():
        model = open_model(path)
        layout = layout_for(model, "vpp-async", 2) if link.is_prefill else model.layout("loop", 1)
        pipe = Pipeline(model.stages(layout, link.groups), link.groups, timeout_s=120)
        first = link.is_prefill and any(s.is_first for s in pipe.stages)
        greedy, ids = Sampler(), None
        if link.is_prefill:  # what vpp.kv.disaggregated.generate_disaggregated does, with the bytes kept
            res = pipe.prefill(prompt if first else None, 8, schedule="vpp-async", request_ids=[7])
            ids = [int(greedy.sample(pipe.next_logits(res, [7]))[0])]
        report = hand_over(pipe, link, [7] if link.is_prefill else None, payload=ids, reserve=NEW)
        out[(name, "bytes")] = (link.role, report.bytes_sent, report.bytes_received, report.tokens[7])
        out[(name, "tokens")] = None
        if not link.is_prefill:  # the installed caches against an unsplit prefill's, row by row
            ref = model.build((0, model.num_layers), ParallelGroups.single())
            ref(prompt, "ref", 0)
            expected, mine = ref.export_cache("ref"), pipe.export_cache(7)
            out[(name, "rows")] = max(float((mine[n] - expected[n]).abs().max()) for n in mine)
            generated = {7: list(report.payload)}
            pipe.continue_generation(generated, NEW, greedy)
            out[(name, "tokens")] = generated[7]
            pipe.release(7)
    return out


@pytest.fixture(scope="module")
def results(references, worlds):
    prompt, refs = references
    return worlds.run(6, _world, {name: path for name, (path, _, _) in refs.items()}, prompt, timeout=900)


@pytest.mark.slow  # one case on the session's world of 6 ranks
@pytest.mark.parametrize("model_type", FAMILIES)
def test_cp2_pp2_prefill_tp2_decode_equals_transformers_generate(model_type, results, references):
    expected = references[1][model_type][1]
    for rank in (4, 5):  # the decode instance
        assert results[rank][(model_type, "tokens")] == expected, f"decode rank {rank}"


@pytest.mark.slow  # one case on the session's world of 6 ranks
@pytest.mark.parametrize("model_type", FAMILIES)
def test_each_decode_rank_holds_every_token_in_token_order(model_type, results):
    """Decoding alone cannot tell (attention and the indexer's top-k do not depend on the rows' order):
    the installed caches equal an unsplit prefill's, row t holding token t (Qwen's one KV head and
    MLA's latent are whole on each TP rank)."""
    for rank in (4, 5):
        assert results[rank][(model_type, "rows")] <= 1e-5, f"decode rank {rank}"


@pytest.mark.slow  # one case on the session's world of 6 ranks
@pytest.mark.parametrize("model_type", FAMILIES)
def test_each_decode_rank_receives_every_token_of_its_caches_once(model_type, results, references):
    cfg = references[1][model_type][2]
    moved = [r[(model_type, "bytes")] for r in results]
    assert [m[0] for m in moved] == ["prefill"] * 4 + ["decode"] * 2
    assert all(m[3] == PROMPT for m in moved)
    for role, sent, received, _ in moved[4:]:
        assert received == PROMPT * _cache_bytes_per_token(cfg, 2)
    assert sum(m[1] for m in moved[:4]) == sum(m[2] for m in moved[4:])
    assert all(m[1] > 0 for m in moved[:4])  # every CP shard of every stage sent its rows


def test_the_directory_form_refuses_a_sharded_cache_in_one_line(tmp_path):
    from types import SimpleNamespace

    from vpp.kv.files import load_cache, save_cache
    from vpp.parallel.groups import Group
    pipe = SimpleNamespace(groups=SimpleNamespace(cp=Group((0, 1), 0), members=(0, 1), global_rank=0), stages=[])
    with pytest.raises(ValueError, match=r"sharded over 2 CP ranks; saving them to a directory is not supported yet"):
        save_cache(pipe, 0, str(tmp_path))
    with pytest.raises(ValueError, match=r"context-parallel \(cp=2\): loading caches into them is not supported"):
        load_cache(pipe, 0, str(tmp_path))
