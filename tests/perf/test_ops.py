"""The cost model's arithmetic against FLOPs and bytes computed by hand for small configs."""

import pytest

from vpp.perf.arch import Arch
from vpp.perf.configs import get_config
from vpp.perf.ops import Parallel, causal_pairs, embed_ops, head_ops, layer_ops, pp_message_bytes, sparse_pairs

from tests.perf.archs import TINY_DSA, TINY_GQA, TINY_MLA

PAR = Parallel(tp=2, weight_bytes=1)

def ops_by_name(cfg, layer, c, L, par=PAR):
    return {op.name: op for op in layer_ops(Arch.from_config(cfg), layer, c, L, par)}


def test_pairs():
    assert causal_pairs(4, 6) == 4 * 6 + 4 * 5 / 2 == 34
    # queries see 7, 8, 9, 10 keys; top-8 caps the last three
    assert sparse_pairs(4, 6, 8) == 7 + 8 + 8 + 8 == 31
    assert sparse_pairs(4, 0, 100) == causal_pairs(4, 0) == 10
    assert sparse_pairs(3, 50, 8) == 24


def test_arch_parsing():
    ds = Arch.from_config(get_config("deepseek-v3.1"))
    assert (ds.attention, ds.layers, ds.dense_layers, ds.experts, ds.top_k, ds.shared) == ("mla", 61, (0, 1, 2), 256, 8, 1)
    glm = Arch.from_config(get_config("glm-5.2"))
    assert (glm.attention, glm.layers, glm.index_topk, glm.index_heads, glm.v_dim) == ("dsa", 78, 2048, 32, 256)
    qw = Arch.from_config(get_config("qwen3-coder-30b-a3b"))
    assert (qw.attention, qw.kv_heads, qw.head_dim, qw.experts, qw.dense_layers) == ("gqa", 4, 128, 128, ())
    assert ds.kv_bytes_per_token == 576 and glm.kv_bytes_per_token == 576 + 128 and qw.kv_bytes_per_token == 1024


def test_mla_layer_by_hand():
    # tp = 2 -> 2 heads per rank; chunk c = 4 after L = 6 cached; dense layer 0.
    ops = ops_by_name(TINY_MLA, 0, 4, 6)
    assert ops["q_a_proj"].flops == 2 * 4 * 64 * 32                         # replicated down-projection
    assert ops["q_a_proj"].bytes == 64 * 32 * 1 + 4 * (64 + 32) * 2          # int8 weights + bf16 in/out
    assert ops["q_b_proj"].flops == 2 * 4 * 32 * 2 * (8 + 4)
    assert ops["kv_a_proj"].flops == 2 * 4 * 64 * (16 + 4)
    assert ops["kv_b_proj"].flops == 2 * 4 * 16 * 2 * (8 + 8)
    assert ops["attention"].flops == 2 * 34 * 2 * (8 + 4 + 8) == 2720      # 34 causal pairs
    assert ops["prefix_kv_up"].flops == 2 * 6 * 16 * 2 * (8 + 8) == 6144    # rebuild 6 cached rows
    assert ops["prefix_gather"].bytes == 2 * 6 * (16 + 4) * 2
    assert ops["prefix_slice"].bytes == 6 * 2 * (2 * 16 + 2 * 12) * 2
    assert ops["o_proj"].flops == 2 * 4 * 2 * 8 * 64
    assert ops["gate_up_proj"].flops == 2 * 4 * 64 * 2 * 24 and ops["down_proj"].flops == 2 * 4 * 24 * 64
    assert ops["attn_allreduce"].bytes == 4 * 64 * 2 and ops["attn_allreduce"].group == 2
    fresh = ops_by_name(TINY_MLA, 0, 4, 0)
    assert "prefix_kv_up" not in fresh and fresh["attention"].flops == 2 * 10 * 2 * 20


def test_moe_layer_by_hand():
    ops = ops_by_name(TINY_MLA, 1, 4, 6)                                   # layer 1 is MoE
    assert ops["router"].flops == 2 * 4 * 64 * 4
    # 4 tokens x top-2 / ep 2 = 4 token-expert rows on this rank, 3 matrices of 64 x 16
    assert ops["experts"].flops == 2 * 4 * 3 * 64 * 16
    hit = 2 * (1 - (1 - 2 / 4) ** 4)                                          # local experts that get a token
    assert ops["experts"].bytes == pytest.approx(hit * 3 * 64 * 16 * 1 + 4 * (2 * 64 + 4 * 16) * 2)
    assert ops["shared_gate_up"].flops == 2 * 4 * 64 * 2 * 8                # 1 shared expert of 16, tp 2
    assert ops["moe_allreduce"].bytes == 4 * 64 * 2


def test_gqa_layer_by_hand():
    ops = ops_by_name(TINY_GQA, 0, 4, 6)
    # 2 query heads and 1 KV head per rank, head_dim 16
    assert ops["qkv_proj"].flops == 2 * 4 * 64 * (2 + 2 * 1) * 16
    assert ops["attention"].flops == 4 * 34 * 2 * 16
    assert ops["o_proj"].flops == 2 * 4 * 32 * 64


def test_dsa_layer_by_hand():
    ops = ops_by_name(TINY_DSA, 0, 4, 6)
    assert "prefix_kv_up" not in ops and "kv_b_proj" not in ops            # latent (absorbed) mode
    assert ops["q_absorb"].flops == 2 * 4 * 2 * 8 * 16
    assert ops["index_scores"].flops == 2 * 34 * 2 * 8 + 2 * 34 * 2        # replicated indexer, 2 heads x 8
    assert ops["index_scores"].lowp
    assert ops["index_topk"].bytes == 34 * 4 * 2
    assert ops["sparse_attention"].flops == 2 * 31 * 2 * (20 + 16)        # 31 sparse pairs, latent dims
    assert ops["sparse_attention"].bytes == 31 * 20 * 2
    assert ops["v_absorb"].flops == 2 * 4 * 2 * 16 * 8


def test_embed_head_and_message():
    arch = Arch.from_config(TINY_MLA)
    emb = {op.name: op for op in embed_ops(arch, 4, PAR)}
    assert emb["embedding"].bytes == 2 * 4 * 64 * 2 and emb["embed_allreduce"].bytes == 4 * 64 * 2
    head = {op.name: op for op in head_ops(arch, 4, PAR)}
    assert head["lm_head"].flops == 2 * 1 * 64 * 50                         # last token only, vocab / tp
    assert pp_message_bytes(arch, 4, PAR) == 4 * 64 * 2 * 2                 # hidden + residual


def test_deepseek_active_parameters():
    # tp = 1: GEMM FLOPs per token / 2 = activated parameters in the layers (~35.7B of the 37B, the rest
    # being embedding and LM head), the published "37B activated".
    arch = Arch.from_config(get_config("deepseek-v3.1"))
    par = Parallel(tp=1)
    flops = sum(op.flops for i in range(arch.layers) for op in layer_ops(arch, i, 1, 0, par)
                if op.kind == "gemm" and op.name != "q_absorb")
    assert flops / 2 == pytest.approx(35.7e9, rel=0.02)


def test_bad_inputs():
    with pytest.raises(ValueError, match="cannot be split over tp=3"):
        layer_ops(Arch.from_config(TINY_MLA), 0, 4, 0, Parallel(tp=3))
    with pytest.raises(ValueError, match="tokens >= 1"):
        layer_ops(Arch.from_config(TINY_MLA), 0, 0, 0, PAR)


def test_dsa_shared_indexer_layers():
    cfg = {**TINY_DSA, "indexer_types": ["full", "shared"]}
    arch = Arch.from_config(cfg)
    assert arch.shared_index_layers == (1,) and arch.runs_indexer(0) and not arch.runs_indexer(1)
    assert "index_scores" in ops_by_name(cfg, 0, 4, 6) and "index_scores" not in ops_by_name(cfg, 1, 4, 6)
    assert "sparse_attention" in ops_by_name(cfg, 1, 4, 6)
    freq = Arch.from_config({**TINY_DSA, "num_hidden_layers": 6, "index_topk_freq": 2})
    assert freq.shared_index_layers == (2, 4)          # offset 2: layers 0, 1, 3, 5 run their own indexer
