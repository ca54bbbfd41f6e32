"""TP attention pieces against direct (slow, obvious) references: the bottom-right causal kernel,
the gathered sparse attention, the lightning indexer, MLA's absorbed path, the per-request caches,
RoPE against transformers' RoPE functions; and the TP = 2 sharded modules (GQA with KV heads split
and replicated, MLA, DSA) against the same modules unsharded.

Tolerance: fp32, O(1) values, reductions of <= 64 terms computed in another order: errors are a
few 1e-7; ``atol=rtol=1e-5`` is ~20x that, while every bug these tests target (mask alignment, a
wrong gathered row, a wrong head) moves results by O(0.1).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import vpp.transformer.attention.mla as mla_module
from vpp.transformer.attention import (
    Chunk, DSASpec, GrowingBuffer, Indexer, MLAttention, MLASpec, RequestCache, RopeSpec, RotaryEmbedding,
    causal_attention, kv_head_shard, sparse_latent_attention,
)
from vpp.parallel.groups import Group
from vpp.parallel.sharding import load_state

TOL = dict(atol=1e-5, rtol=1e-5)


def _randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _naive_attention(q, k, v, scale, allowed):
    """softmax over the allowed keys; q [H, Lq, D], k/v [Hk, Lk, *], allowed [Lq, Lk] or [H, Lq, Lk]."""
    k = k.repeat_interleave(q.shape[0] // k.shape[0], 0)
    v = v.repeat_interleave(q.shape[0] // v.shape[0], 0)
    scores = (q @ k.transpose(1, 2) * scale).masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("lq,lk,dq,dv", [(3, 7, 8, 8), (7, 7, 8, 8), (1, 9, 8, 5), (4, 6, 6, 10)])
def test_causal_kernel_aligns_the_diagonal_bottom_right(lq, lk, dq, dv):
    q, k, v = _randn(1, 4, lq, dq), _randn(2, 2, lk, dq), _randn(3, 2, lk, dv)
    allowed = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)  # query i sees keys <= lk - lq + i
    out = causal_attention(q, k, v, 0.3)
    torch.testing.assert_close(out, _naive_attention(q, k, v, 0.3, allowed), **TOL)
    if lq < lk and dq == dv:  # the pitfall: SDPA's is_causal aligns top-left when Lq != Lk
        top_left = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=0.3,
                                                  enable_gqa=True)[0]
        assert (top_left - out).abs().max() > 0.1


def test_causal_kernel_rejects_more_queries_than_keys():
    with pytest.raises(ValueError, match="5 queries but only 3 keys"):
        causal_attention(_randn(0, 2, 5, 4), _randn(0, 2, 3, 4), _randn(0, 2, 3, 4), 1.0)


@pytest.mark.parametrize("queries_per_block", [1, 3, 6])
def test_sparse_latent_attention_equals_masked_dense(queries_per_block):
    c, heads, width, total, k, value_dim = 6, 3, 10, 15, 4, 7
    budget = queries_per_block * k * (width * 4 + heads * 8)  # a query's gathered rows, fp32 scores and probs
    q, latent = _randn(1, c, heads, width), _randn(2, total, width)
    topk = torch.stack([torch.randperm(total, generator=torch.Generator().manual_seed(i))[:k] for i in range(c)])
    topk[0, 1:] = -1  # a query with a single key
    topk[1, 3] = -1
    allowed = torch.zeros(c, total, dtype=torch.bool)
    for i in range(c):
        allowed[i, topk[i][topk[i] >= 0]] = True
    out = sparse_latent_attention(q, latent, topk, value_dim, 0.4, budget=budget)
    ref = torch.stack([_naive_attention(q[i][:, None], latent[None], latent[None, :, :value_dim], 0.4,
                                        allowed[i][None])[:, 0] for i in range(c)])
    torch.testing.assert_close(out, ref, **TOL)


def _indexer(spec, hidden=24, q_rank=20, rope=4):
    idx = Indexer(spec, hidden, q_rank, rope)
    shapes = {n: p.shape for n, p in idx.named_parameters()}
    load_state(idx, lambda n: _randn(len(n), *shapes[n]) + (1 if n == "k_norm.weight" else 0))
    return idx


@pytest.mark.parametrize("interleave", [False, True])
def test_indexer_selects_the_top_causal_keys(interleave):
    spec = DSASpec(index_topk=5, index_n_heads=16, index_head_dim=8, rope_interleave=interleave)
    idx = _indexer(spec)
    idx.workspace_bytes = 2 * (16 + 2) * 14 * 4  # two queries' scores over 14 keys per block
    total, c, offset = 14, 6, 8
    x, q_resid = _randn(1, total, 24), _randn(2, total, 20)
    cos, sin = RotaryEmbedding(RopeSpec(4))(torch.arange(total), torch.float32)
    keys = idx.keys(x, cos, sin)
    got = idx.select(x[offset:], q_resid[offset:], keys, offset, cos[offset:], sin[offset:])
    # brute force, as written in DeepSeek-V3.2's paper: I[i,t] = sum_h w[i,h] relu(q[i,h].k[t] / sqrt(d))
    q = idx._rotate(idx.wq_b(q_resid).view(total, 16, 8), cos, sin)
    w = idx.weights_proj(x) / 4
    scores = torch.einsum("ih,iht->it", w, torch.relu(torch.einsum("ihd,td->iht", q, keys) / math.sqrt(8)))
    for i in range(c):
        pos = offset + i
        want = scores[pos, : pos + 1].topk(min(5, pos + 1)).indices
        assert sorted(got[i][got[i] >= 0].tolist()) == sorted(want.tolist()), f"query {pos}"
    assert got.shape == (c, 5)
    early = idx.select(x[:3], q_resid[:3], keys[:3], 0, cos[:3], sin[:3])  # fewer keys than k
    assert early.shape == (3, 3) and sorted(early[0].tolist()) == [-1, -1, 0]


def _mla(dsa=None):
    spec = MLASpec(hidden_size=32, num_heads=4, q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=8,
                   qk_rope_head_dim=8, v_head_dim=6, softmax_scale=0.25)
    module = MLAttention(spec, Group.single(), dsa=dsa)
    shapes = {n: p.shape for n, p in module.named_parameters()}
    load_state(module, lambda n: torch.ones(shapes[n]) if n.endswith("norm.weight")
               else _randn(len(n), *shapes[n]) * shapes[n][-1] ** -0.5)
    return module


@torch.inference_mode()
def test_mla_absorbed_sparse_path_equals_expanded_dense_path():
    module, total = _mla(), 9
    x = _randn(5, total, 32)
    cos, sin = RotaryEmbedding(RopeSpec(8))(torch.arange(total), torch.float32)
    module(x, Chunk("r", 0, cos, sin))
    latent = module.cache.get("r")["latent"]
    assert latent.shape == (total, 12 + 8)  # the compressed latent is cached, not per-head K/V
    q = module.q_b_proj(module.q_a_layernorm(module.q_a_proj(x))).view(total, 4, 16)
    q_nope, q_rope = q.split([8, 8], -1)
    q_rope = module._rope(q_rope, cos, sin)
    every_causal_key = torch.arange(total)[None, :].expand(total, total).tril().masked_fill(
        torch.ones(total, total, dtype=torch.bool).triu(1), -1)
    torch.testing.assert_close(module._sparse(q_nope, q_rope, latent, every_causal_key),
                               module._dense(q_nope, q_rope, latent), **TOL)


@torch.inference_mode()
def test_dsa_attends_through_the_gathered_path_once_the_prefix_exceeds_topk(monkeypatch):
    module = _mla(DSASpec(index_topk=6, index_n_heads=16, index_head_dim=12))
    dense_calls = []
    real = mla_module.causal_attention
    monkeypatch.setattr(mla_module, "causal_attention", lambda *a: dense_calls.append(a[1].shape[1]) or real(*a))
    x = _randn(5, 20, 32)
    cos, sin = RotaryEmbedding(RopeSpec(8))(torch.arange(20), torch.float32)
    for s in range(0, 20, 4):
        chunk = Chunk("r", s, cos[s:s + 4], sin[s:s + 4])
        module(x[s:s + 4], chunk)
        assert (chunk.topk is None) == (s + 4 <= 6)  # a selection exists once keys outnumber topk
        if chunk.topk is not None:
            assert chunk.topk.shape == (4, 6)
    assert dense_calls == [4]  # only the first chunk (4 keys <= 6) ran dense attention
    assert set(module.cache.get("r")) == {"latent", "index_k"}


def test_growing_buffer_doubles_and_keeps_contents():
    buf, capacities = GrowingBuffer(dim=1), []
    rows = [_randn(i, 2, n, 3) for i, n in enumerate((1, 1, 1, 2, 5, 40))]
    for r in rows:
        buf.append(r)
        capacities.append(buf.capacity)
    assert capacities == [1, 2, 4, 8, 16, 50]  # doubling, or exactly what a large append needs
    assert torch.equal(buf.view(), torch.cat(rows, dim=1))


def test_request_cache_keeps_requests_apart_and_checks_offsets():
    cache = RequestCache("test", {"k": 0})
    cache.append("a", 0, k=torch.zeros(3, 2))
    cache.append("b", 0, k=torch.ones(2, 2))
    cache.append("a", 3, k=torch.full((1, 2), 2.0))
    assert (cache.length("a"), cache.length("b"), cache.length("c")) == (4, 2, 0)
    assert cache.requests() == ["a", "b"] and cache.get("a")["k"][3].tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match=r"request 'b' chunk at offset 3, but its cache holds 2 tokens"):
        cache.append("b", 3, k=torch.zeros(1, 2))
    with pytest.raises(ValueError, match="cache parts"):
        cache.append("b", 2, v=torch.zeros(1, 2))
    cache.release("a")
    assert cache.requests() == ["b"] and cache.length("a") == 0 and cache.get("a") == {}


def test_kv_head_shard_splits_or_replicates():
    def indices(kv, tp):
        return [kv_head_shard(kv, Group(tuple(range(tp)), r)).index for r in range(tp)]
    assert indices(4, 2) == [0, 1] and indices(2, 4) == [0, 0, 1, 1] and indices(1, 2) == [0, 0]
    with pytest.raises(ValueError, match="tp=2 is neither a divisor nor a multiple of num_key_value_heads=3"):
        kv_head_shard(3, Group((0, 1), 0))


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
        "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0}


@pytest.mark.parametrize("params", [{"rope_type": "default", "rope_theta": 5e5}, YARN,
                                    {**YARN, "mscale_all_dim": 1.0}, {"rope_type": "linear", "factor": 2.0}])
def test_rope_matches_transformers(params):
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding, yarn_apply_mscale
    hf = DeepseekV3Config(qk_rope_head_dim=32, max_position_embeddings=163840, rope_parameters=dict(params))
    spec = RopeSpec.from_hf(hf.to_dict(), 32)
    if params["rope_type"] == "default":
        ref, factor = DeepseekV3RotaryEmbedding.compute_default_rope_parameters(hf)
    else:
        ref, factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf)
    torch.testing.assert_close(spec.inv_freq(), ref, rtol=1e-6, atol=0)
    assert spec.attention_factor == pytest.approx(factor)
    assert 0.125 * spec.softmax_mscale == pytest.approx(yarn_apply_mscale(hf.rope_parameters, 0.125))


@pytest.mark.parametrize("params", [{"rope_type": "default"}, YARN])
def test_rope_on_meta_has_the_cpu_tensors_shape_and_dtype(params):
    """A shape-only build (``device="meta"``, ``ModelSource.check``) takes the CPU's inv_freq, moved."""
    spec = RopeSpec.from_hf({"max_position_embeddings": 163840, "rope_parameters": dict(params)}, 32)
    meta, cpu = spec.inv_freq("meta"), spec.inv_freq()
    assert meta.device.type == "meta" and (meta.shape, meta.dtype) == (cpu.shape, cpu.dtype)


@pytest.mark.slow
def test_a_meta_build_and_the_attention_kernels_do_not_import_dynamo():
    """torch._dynamo costs about a second of every process that imports it (each spawned rank, each
    CLI run): importing the models and building a stage on meta, as ``ModelSource.check`` does before
    ranks start, must not pull it in (torch.nn.attention.bias and arange on meta would)."""
    import os
    import pathlib
    import subprocess
    import sys
    root = str(pathlib.Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    code = ("import sys; from vpp.models.build import build_stage; from vpp.models.tiny import TINY_CONFIGS; "
            "from vpp.parallel.groups import ParallelGroups; import vpp.runtime; "
            "[build_stage(TINY_CONFIGS[m], (0, 2), ParallelGroups.single(), device='meta') "
            "for m in ('tiny-qwen', 'tiny-deepseek', 'tiny-glm')]; "
            "assert 'torch._dynamo' not in sys.modules, [m for m in sys.modules if m.startswith('torch._dynamo')][:3]")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_rope_reads_the_legacy_spelling_and_rejects_unknown_types():
    legacy = {"rope_theta": 10000.0, "max_position_embeddings": 163840,
              "rope_scaling": {"type": "yarn",
                               **{k: v for k, v in YARN.items() if k not in ("rope_type", "rope_theta")}}}
    assert RopeSpec.from_hf(legacy, 64) == RopeSpec.from_hf({"rope_parameters": YARN}, 64)
    with pytest.raises(ValueError, match="rope_type 'longrope' is not supported; supported: default, linear, yarn"):
        RopeSpec.from_hf({"rope_parameters": {"rope_type": "longrope"}}, 64)


@pytest.mark.parametrize("check", [("gqa", 4, 2), ("gqa", 4, 1), ("gqa", 2, 2), ("mla",), ("dsa",)],
                         ids=["gqa-kv-split", "gqa-kv-replicated", "gqa-one-head-per-rank", "mla", "dsa"])
@pytest.mark.slow
def test_tp2_attention_equals_unsharded(check, tp2_results):
    for rank, res in enumerate(tp2_results):
        assert res[check] < 1e-5, f"rank {rank}: max abs error {res[check]:.2e}"
