"""Shapes and settings an independent check reaches for, against transformers in one process (the
chunked, cached and pipelined matrix with the default tiny configs is tests/models/test_parity.py):

* configs the default tiny models do not take: no query compression (q_lora_rank null), half-split
  MLA rope, GLM-5's value heads wider than its nope heads, unnormalised sigmoid weights without
  scaling, 4 groups of which 2 stay eligible, a tied LM head, a softmax router without
  renormalisation over 2 KV heads of 32, and YaRN at positions past original_max_position_embeddings;
* DSA with index_topk below, equal to and above the prompt, and chunk boundaries that cut the top-k
  window (the prefix reaching index_topk inside a chunk, a one-token chunk right after it);
* the indexer's selected positions themselves, per query and layer, against transformers' indexer
  (its forward returns them); with few indexer heads relu leaves exact-zero scores tied at the top-k
  boundary, where the two may keep different keys of *equal* score: torch.topk orders ties as its
  kernel likes, and transformers' own prefill (one row of every key) and decode (a row of the cached
  keys) do not agree with each other either, so the check there is on the selected scores;
* decoding from a prompt shorter than index_topk into the sparse regime, against transformers'
  greedy generate;
* router rows tied exactly (identical gate rows and biases, within and across expert groups): the
  experts and weights transformers' routers pick.

Tolerance: as tests/models/test_parity.py (fp32 sums reordered: ~2e-6 to 4e-6 on logits of O(1-5);
``atol=rtol=1e-4``). The tied head makes the logits ~8x larger (the embedding has std 1), still far
inside it.
"""

from __future__ import annotations

import pytest
import torch

from tests.models.hf_tiny import VOCAB, model as hf_model
from vpp.config import model_config
from vpp.models import load_stage
from vpp.models.blocks import moe_config
from vpp.parallel import ParallelGroups
from vpp.runtime import Pipeline
from vpp.transformer.router import Router

TOL = dict(atol=1e-4, rtol=1e-4)
N = 53  # the prompt: no chunk size below divides it

VARIANTS = {
    "q-lora-none": ("deepseek_v3", dict(q_lora_rank=None)),
    "half-split-rope": ("deepseek_v3", dict(rope_interleave=False)),
    "v-wider-than-nope": ("glm_moe_dsa", dict(qk_nope_head_dim=8, v_head_dim=24)),
    "unnormalised-unscaled": ("deepseek_v32", dict(norm_topk_prob=False, routed_scaling_factor=1.0)),
    "4-groups-2-eligible-top3": ("deepseek_v3", dict(n_group=4, topk_group=2, num_experts_per_tok=3)),
    "tied-head": ("glm_moe_dsa", dict(tie_word_embeddings=True)),
    "qwen-softmax-unnormalised": ("qwen3_moe", dict(norm_topk_prob=False, num_key_value_heads=2, head_dim=32,
                                                    decoder_sparse_step=2, mlp_only_layers=[])),
    "index-topk-1": ("deepseek_v32", dict(index_topk=1)),
    "index-topk-prompt-1": ("glm_moe_dsa", dict(index_topk=N - 1)),
    "index-topk-prompt": ("deepseek_v32", dict(index_topk=N)),
    "index-topk-above-prompt": ("glm_moe_dsa", dict(index_topk=N + 40)),
}
# whole prompt, larger than it, one token, 3 (ragged), the index_topk window cut (8 = the default
# index_topk: the prefix passes it inside the 2nd chunk of [5, 5, ...]; [52, 1]: one token after N - 1)
CHUNKINGS = (N, 100, 1, 3, [5] * 10 + [3], [7, 1, 45], [N - 1, 1])


def _ids(n: int, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def _sizes(chunking, n: int) -> list[int]:
    return list(chunking) if isinstance(chunking, list) else [min(chunking, n - s) for s in range(0, n, chunking)]


def _prefill(stage, ids, chunking) -> torch.Tensor:
    out, s = [], 0
    for c in _sizes(chunking, len(ids)):
        out.append(stage(ids[s:s + c], "r", s))
        s += c
    stage.release("r")
    return torch.cat(out)


def _saved(tmp_path, model_type, **kw):
    m = hf_model(model_type, **kw)
    m.save_pretrained(tmp_path)
    return m, load_stage(tmp_path, (0, m.config.num_hidden_layers), ParallelGroups.single())


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_config_variants_match_transformers(name, tmp_path):
    model_type, kw = VARIANTS[name]
    m, stage = _saved(tmp_path, model_type, **kw)
    ids = _ids(N)
    with torch.no_grad():
        ref = m(ids[None]).logits[0]
    for chunking in CHUNKINGS:
        torch.testing.assert_close(_prefill(stage, ids, chunking), ref, **TOL,
                                   msg=lambda m, c=chunking: f"chunks {c}: {m}")


@pytest.mark.parametrize("model_type", ["deepseek_v3", "qwen3_moe"])
def test_yarn_past_the_original_context(model_type, tmp_path):
    # 150 positions with original_max_position_embeddings 64 and factor 4 (mscale != mscale_all_dim)
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
            "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0}
    m, stage = _saved(tmp_path, model_type, rope_parameters=rope)
    ids = _ids(150)
    with torch.no_grad():
        ref = m(ids[None]).logits[0]
    for chunking in (150, 37, [63, 2, 85]):
        torch.testing.assert_close(_prefill(stage, ids, chunking), ref, **TOL,
                                   msg=lambda m, c=chunking: f"chunks {c}: {m}")


def _hf_selections(m, ids) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """layer -> (transformers' top-k positions [n, k], its index scores [n, n], future keys -inf), for
    the layers with an indexer of their own. The scores are the tensor its indexer takes the top-k of."""
    out, inside, hooks = {}, [], []
    real_topk = torch.Tensor.topk

    def spy(t, *args, **kw):
        if inside:
            out[inside[-1]] = (None, t[0].clone())
        return real_topk(t, *args, **kw)

    for i, layer in enumerate(m.model.layers):
        indexer = layer.self_attn.indexer
        if indexer is not None:
            hooks.append(indexer.register_forward_pre_hook(lambda mod, args, i=i: inside.append(i)))
            hooks.append(indexer.register_forward_hook(lambda mod, args, res, i=i: _done(i, res)))

    def _done(i, res):  # returns None: the hook leaves the output alone
        inside.pop()
        out[i] = (res[0].long(), out[i][1])

    torch.Tensor.topk = spy
    try:
        with torch.no_grad():
            m(ids[None])
    finally:
        torch.Tensor.topk = real_topk
        for h in hooks:
            h.remove()
    return out


def _vpp_selections(stage, ids, chunking) -> dict[int, list[set[int]]]:
    """layer -> per query, the key positions vpp's indexer keeps (every causal key on a dense chunk)."""
    picked: dict[int, dict[int, set[int]]] = {}
    for name, layer in stage.model.layers.items():
        indexer = layer.self_attn.indexer
        if indexer is None:
            continue
        select = indexer.select

        def record(x, q_resid, keys, offset, cos, sin, select=select, layer=int(name)):
            topk = select(x, q_resid, keys, offset, cos, sin)
            for j, row in enumerate(topk.tolist()):
                picked.setdefault(layer, {})[offset + j] = {t for t in row if t >= 0}
            return topk

        indexer.select = record
    _prefill(stage, ids, chunking)
    return {layer: [rows.get(i, set(range(i + 1))) for i in range(len(ids))] for layer, rows in picked.items()}


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
@pytest.mark.parametrize("index_topk", [8, N - 1])
def test_indexer_selects_the_keys_transformers_selects(model_type, index_topk, tmp_path):
    m, stage = _saved(tmp_path, model_type, index_topk=index_topk)
    ids = _ids(N)
    ref = _hf_selections(m, ids)
    for chunking in (N, 5, [7, 1, 45], [N - 1, 1]):
        ours = _vpp_selections(stage, ids, chunking)
        assert sorted(ours) == sorted(ref)  # the same layers run an indexer
        for layer, rows in ours.items():
            for i, got in enumerate(rows):
                want = {t for t in ref[layer][0][i].tolist() if t <= i}  # short rows are padded with future keys
                assert got == want, f"{chunking}, layer {layer}, query {i}: vpp {sorted(got)}, " \
                                    f"transformers {sorted(want)}"


def test_few_indexer_heads_differ_only_among_tied_scores(tmp_path):
    """4 indexer heads: relu leaves exact-zero index scores at the top-k boundary of some queries.
    In the first layer where vpp and transformers keep different keys (their inputs still agree to
    rounding), they keep as many, and every key one keeps and the other does not has the score of
    transformers' weakest kept key: both are a valid top-k. (Later layers then see different
    attention outputs, so their scores legitimately differ.)"""
    m, stage = _saved(tmp_path, "deepseek_v32", index_n_heads=4, index_topk=8)
    ids = _ids(N)
    ref = _hf_selections(m, ids)
    differ = 0
    for chunking in (5, 16):
        for layer, rows in sorted(_vpp_selections(stage, ids, chunking).items()):
            topk, scores = ref[layer]
            diverged = False
            for i, got in enumerate(rows):
                want = {t for t in topk[i].tolist() if t <= i}
                if got == want:
                    continue
                differ, diverged = differ + 1, True
                weakest = min(scores[i, t].item() for t in want)
                assert len(got) == len(want), (chunking, layer, i)
                assert all(scores[i, t].item() == weakest for t in got ^ want), (chunking, layer, i)
            if diverged:
                break
    assert differ > 0  # this model does tie; otherwise the test would check nothing


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
@pytest.mark.parametrize("n,chunk", [(1, 1), (5, 2), (8, 8)])
def test_decode_from_below_index_topk_into_sparse(model_type, n, chunk, tmp_path):
    """Prompts of 1, 5 and 8 tokens with index_topk 8: prefill and the first decode steps are dense,
    the later ones select 8 of their keys; greedy tokens equal transformers' generate."""
    m, stage = _saved(tmp_path, model_type, index_topk=8)
    ids = _ids(n, seed=3)
    with torch.no_grad():
        ref = m.generate(ids[None], attention_mask=torch.ones_like(ids)[None], max_new_tokens=12, do_sample=False,
                         pad_token_id=0, eos_token_id=None)[0, n:].tolist()
    pipe = Pipeline([stage], ParallelGroups.single())
    assert pipe.generate(ids, 12, chunk, schedule="cpp").tokens[0] == ref


@pytest.mark.parametrize("model_type,groups", [("deepseek_v3", (2, 1, 2)), ("deepseek_v3", (4, 2, 3)),
                                               ("deepseek_v3", (1, 1, 2)), ("qwen3_moe", (1, 1, 2))])
def test_tied_router_rows_pick_the_experts_transformers_picks(model_type, groups):
    """Experts with identical router rows (and correction biases) score exactly alike, for every token
    (all 8 rows equal) or pairwise: the choice among them is torch.topk's order of ties, the same
    call on the same row in both, so the same experts with the same weights."""
    n_group, topk_group, k = groups
    m = hf_model(model_type, n_group=n_group, topk_group=topk_group, num_experts_per_tok=k)
    ref = m.model.layers[1].mlp.gate
    cfg = model_config(m.config.to_dict())
    ours = Router(moe_config(cfg))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, cfg["hidden_size"], generator=g)
    every = (torch.randn(1, cfg["hidden_size"], generator=g).expand(8, -1), torch.zeros(8))  # all 8 tie
    pairs = (torch.randn(4, cfg["hidden_size"], generator=g).repeat_interleave(2, 0),
             torch.randn(4, generator=g).repeat_interleave(2) * 0.1)
    for rows, bias in (every, pairs):
        with torch.no_grad():
            ref.weight.copy_(rows)
            ours.weight.copy_(rows)
            if ours.e_score_correction_bias is not None:
                ref.e_score_correction_bias.copy_(bias)
                ours.e_score_correction_bias.copy_(bias)
            _, want_w, want_ids = ref(x)
        got_w, got_ids = ours(x)
        order_ours, order_ref = got_ids.argsort(-1), want_ids.argsort(-1)
        assert torch.equal(got_ids.gather(1, order_ours), want_ids.gather(1, order_ref))
        torch.testing.assert_close(got_w.gather(1, order_ours), want_w.gather(1, order_ref).to(got_w.dtype))
