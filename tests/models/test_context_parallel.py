"""Context parallelism (CP) on real ranks against transformers (tiny random models, fp32).

One gloo world per grid, the session's persistent one (tests/worlds.py), runs every case
(tests/models/cp_checks.py; slow tier, as every test that starts processes): CP2 (2 ranks) and CP2 x TP2 (4 ranks). The fast tier checks the split,
the rule, the memory plan, and the pieces-and-merge arithmetic of every method in one process. Each family (qwen3_moe: GQA; deepseek_v3: MLA; deepseek_v32 and
glm_moe_dsa: DSA with index_topk 8, so chunks past 8 keys select) with each attention method
(all-gather, ring pass-KV, pass-Q): the 37-token prompt in chunks of 16, 16 and 5 (the ragged last
one not a multiple of 2 cp, one rank holding a single piece), a cached prefix of 20 tokens then the
rest, and three requests taking turns chunk by chunk; last-token logits within rel 1e-5 of
transformers' full forward (the observed errors are ~5e-7). Greedy decoding after a CP prefill equals
transformers' ``generate``. Broken variants (a rank's pieces in the wrong order, RoPE at local
positions, partials averaged instead of merged by log-sum-exp, DSA's top-k over a rank's own keys)
must move the logits far past that tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.models.hf_tiny import MODEL_TYPES
from vpp.transformer.attention.context_parallel import Split, choose_method

REL = 1e-5
GREEDY_STEPS = 4
METHODS = ("all-gather", "pass-kv", "pass-q")


@pytest.fixture(scope="session")
def cp2_results(hf_cases, worlds):
    from tests.models.cp_checks import run_cp2_world
    return worlds.run(2, run_cp2_world, list(hf_cases.values()), GREEDY_STEPS, timeout=600)


@pytest.fixture(scope="session")
def cp2tp2_results(hf_cases, worlds):
    from tests.models.cp_checks import run_cp_checks
    return worlds.run(4, run_cp_checks, list(hf_cases.values()), 2, GREEDY_STEPS, timeout=900)


@pytest.fixture(scope="session")
def hf_greedy(hf_cases):
    from tests.models.hf_tiny import model
    out = {}
    for t, case in hf_cases.items():
        with torch.no_grad():
            ids = model(t).generate(case.prompts["a"][None], max_new_tokens=GREEDY_STEPS, do_sample=False)
        out[t] = ids[0, len(case.prompts["a"]):].tolist()
    return out


# --- pure: the split and the rule ----------------------------------------------------------------

@pytest.mark.parametrize("tokens,cp", [(16, 2), (37, 2), (5, 2), (3, 2), (37, 3), (64, 4), (9, 4)])
def test_split_covers_every_token_once_head_tail(tokens, cp):
    split = Split(tokens, cp)
    mine = [split.index(r).tolist() for r in range(cp)]
    assert sorted(sum(mine, [])) == list(range(tokens))  # padding never shows: every real token once
    assert split.padded % (2 * cp) == 0 and split.padded - tokens < 2 * cp
    for r in range(cp):
        first, last = split.bounds(r), split.bounds(2 * cp - 1 - r)
        assert mine[r] == list(range(*first)) + list(range(*last))  # pieces r and 2cp-1-r
        for row, t in enumerate(mine[r]):
            assert split.owner(t) == (r, row)
    if tokens % (2 * cp) == 0:  # equal causal work: each rank's queries see the same number of keys
        work = [sum(t + 1 for t in m) for m in mine]
        assert max(work) == min(work)


def test_meta_rule_picks_pass_kv_for_new_tokens_pass_q_for_a_long_cached_prefix():
    gqa = 2 * 1 / 4  # qwen3_moe tiny: 1 KV head, 4 query heads
    assert choose_method(16, 0, gqa) == "pass-kv"
    assert choose_method(16, 16, gqa) == "pass-kv"  # 16 / 32 = 0.5: the boundary goes to pass-KV
    assert choose_method(5, 32, gqa) == "pass-q"


def test_memory_plan_shards_the_kv_cache_over_cp():
    from vpp.models import model_config
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.perf.arch import Arch
    from vpp.perf.memory_plan import plan_memory, shortfall
    arch = Arch.from_config(model_config(TINY_CONFIGS["tiny-deepseek"]))
    one, two = (plan_memory(arch, [list(range(6))], tp=1, dtype_bytes=4, tokens=1 << 20, chunk=4096, weights=[0],
                            cp=cp)[0] for cp in (1, 2))
    assert two.kv_cache == one.kv_cache // (1 << 20) * ((1 << 19) + 4)  # half the tokens, + 2 cp rows
    budget = (one.total + two.total) // 2
    assert shortfall([one], budget, shared=False) and shortfall([two], budget, shared=False) is None


@pytest.mark.parametrize("cp", [2, 3])
def test_pieces_and_merge_equal_causal_attention_in_one_process(cp):
    """Every rank's queries over every rank's rows (block_partial, merge_all: the arithmetic all three
    methods share), chunk after chunk with the caches sharded, equal the unsplit causal attention."""
    from vpp.parallel import Group
    from vpp.transformer.attention.context_parallel import CPChunk, block_partial, merge_all
    from vpp.transformer.attention.kernel import attention_lse, causal_attention
    g = torch.Generator().manual_seed(0)
    total, scale = 37, 8 ** -0.5
    q, k, v = (torch.randn(h, total, 8, generator=g) for h in (4, 2, 2))
    attend = lambda qs, rows, causal: attention_lse(qs, rows["k"], rows["v"], scale, causal=causal)  # noqa: E731
    cache = [torch.zeros(0, dtype=torch.long) for _ in range(cp)]  # each rank's positions, in row order
    offset = 0
    for tokens in (16, 16, 5):
        split = Split(tokens, cp)
        prefix = tuple(len(c) for c in cache)
        cache = [torch.cat((c, offset + split.index(t))) for t, c in enumerate(cache)]
        info = CPChunk(Group.single(), split, offset, prefix, tuple(cache), "all-gather")
        ref = causal_attention(q[:, :offset + tokens], k[:, :offset + tokens], v[:, :offset + tokens], scale)
        for r in range(cp):
            mine = offset + split.index(r)
            parts = [block_partial(attend, q[:, mine], r, {"k": k[:, cache[t]], "v": v[:, cache[t]]},
                                   {"k": 1, "v": 1}, t, info, 8) for t in range(cp)]
            torch.testing.assert_close(merge_all(parts)[0], ref[:, mine], atol=1e-5, rtol=1e-5)
        offset += tokens


# --- CP2: two spawned ranks ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("method", METHODS)
def test_cp2_matches_transformers(model_type, method, cp2_results):
    for rank, res in enumerate(cp2_results):
        for what in ("chunks", "cached", "stream"):
            error = res[(model_type, what, method)]
            assert error <= REL, f"rank {rank}, {what}: rel error {error:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_cp2_greedy_decode_equals_transformers_generate(model_type, cp2_results, hf_greedy):
    for res in cp2_results:
        assert res[(model_type, "greedy")] == hf_greedy[model_type]


@pytest.mark.slow
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_cp2_kv_cache_is_sharded_no_rank_holds_a_full_copy(model_type, cp2_results, hf_cases):
    tokens = len(hf_cases[model_type].prompts["a"])
    for method in METHODS:
        rows = [res[(model_type, "kv_rows", method)] for res in cp2_results]
        assert sum(rows) == tokens and max(rows) <= math.ceil(tokens / 2) + 1, rows  # 18 and 19 of 37


@pytest.mark.slow
def test_cp2_auto_says_which_method_each_chunk_took(cp2_results):
    """chunks 16, 16, 5: new / (new + cached) = 1, 0.5, 0.14 against qwen's 2 kv / q = 0.5; MLA's
    latent (24 values) against its queries' 4 x 24: 0.25."""
    for res in cp2_results:
        assert res[("qwen3_moe", "auto")] == ["pass-kv", "pass-kv", "pass-q"]
        assert res[("deepseek_v3", "auto")] == ["pass-kv", "pass-kv", "pass-q"]
        for model_type in MODEL_TYPES:
            assert res[(model_type, "chunks", "auto")] <= REL


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["split", "rope", "merge", "topk"])
def test_cp2_parity_catches_a_broken_variant(kind, cp2_results):
    for res in cp2_results:
        assert res[("broken", kind)] > 100 * REL, f"a broken {kind} went unnoticed: {res[('broken', kind)]:.2e}"


# --- CP2 x TP2: four spawned ranks ---------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_cp2_tp2_matches_transformers(model_type, cp2tp2_results, hf_greedy):
    for rank, res in enumerate(cp2tp2_results):
        for method in METHODS:
            for what in ("chunks", "cached", "stream"):
                error = res[(model_type, what, method)]
                assert error <= REL, f"rank {rank}, {method}, {what}: rel error {error:.2e}"
        assert res[(model_type, "greedy")] == hf_greedy[model_type]
