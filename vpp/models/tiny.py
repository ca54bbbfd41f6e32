"""Built-in tiny configurations: each family's real structure (same ``model_type``, MLA ranks, dense
first layer, group-limited routing, DSA indexer with shared layers, YaRN where the family uses it)
shrunk so that a 16K-token prefill runs on a CPU and attention dominates at long context, as in
the paper. Use them with ``build_stage(TINY_CONFIGS[name], ..., weights=random_checkpoint(...))``.

Measured on the 2-core development machine (load average ~1-2 from other work), 16K tokens in 1K
chunks, random weights, one thread per process, median [min-max] of 3 interleaved runs
(``PYTHONPATH=. python benchmarks/tiny_chunk_latency.py --two-ranks``). Per chunk: one stage holding
all 6 layers in one process; "2 ranks": the whole prefill with layers split 3 + 3 over two ranks,
chunks streamed from rank 0 to rank 1 (one run)::

    model          first chunk ms   middle chunk ms   last chunk ms    last/first  1 process  2 ranks
    tiny-qwen       282 [216-490]   1780 [1548-1816]  3253 [2485-3393]    11.5       27.0 s    15.7 s
    tiny-deepseek   421 [327-652]   2437 [2266-2502]  4779 [4486-5268]    10.7       39.9 s    23.5 s
    tiny-glm        865 [829-1021]  1980 [1918-2371]  2432 [2406-2772]     2.9       29.7 s    16.5 s

Dense attention (Qwen GQA, DeepSeek MLA) grows ~linearly with the prefix, like the paper's tau_k.
GLM's DSA attends to 256 gathered keys per query whatever the prefix, so past the first chunk only
its indexer grows: the flattening the paper reports for sparse attention (its section 7.5). Its first
chunk is the slowest of the three because the per-query gather is a fixed cost on a CPU.
"""

from __future__ import annotations

# Positions: 2^20 (1M), so a 100K-1M token prefill runs as is. A stated override, not a trained range:
# the weights are random, so there is no context length they were trained to, and rotary embeddings
# (RoPE with theta 1e6 for tiny-qwen and tiny-glm; tiny-deepseek's YaRN, factor 8 over 4096 original
# positions, kept so its numbers do not change) are defined at every position. A model directory keeps
# its config's max_position_embeddings; raise it there (with its rope_scaling) to go further.
MAX_POSITIONS = 1 << 20

_COMMON = {
    "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6,
    "num_attention_heads": 8, "moe_intermediate_size": 128, "num_experts_per_tok": 4, "norm_topk_prob": True,
    "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
    "initializer_range": 0.02, "attention_bias": False, "bos_token_id": 0, "eos_token_id": 1,
}

TINY_CONFIGS: dict[str, dict] = {
    # Qwen3-30B-A3B shape: GQA 32/4 heads of 128, q/k norm, 128 experts top-8 (softmax), no shared expert
    "tiny-qwen": {
        **_COMMON, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
        "num_key_value_heads": 2, "head_dim": 64, "num_experts": 16, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "use_sliding_window": False, "sliding_window": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    # DeepSeek-V3 shape: MLA (q_lora 1536, kv_lora 512, nope 128 + rope 64, v 128), YaRN factor 40 with
    # mscale, first 3 layers dense, 256 experts in 8 groups (top-4 groups, top-8 experts), 1 shared
    "tiny-deepseek": {
        **_COMMON, "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
        "num_key_value_heads": 8, "q_lora_rank": 192, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32, "v_head_dim": 64, "rope_interleave": True,
        "n_routed_experts": 16, "n_shared_experts": 1, "n_group": 4, "topk_group": 2,
        "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "num_nextn_predict_layers": 0,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                            "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0,
                            "beta_fast": 32.0, "beta_slow": 1.0},
    },
    # GLM-5 shape: MLA (q_lora 2048, kv_lora 512, nope 192 + rope 64, v 256), DSA indexer 32 heads of
    # 128 (rope dims first, interleaved), index_topk 2048 (here a quarter of a 1K chunk), shared-indexer
    # layers (GLM-5.2's IndexShare), first layers dense, 256 experts in one group, 1 shared
    "tiny-glm": {
        **_COMMON, "model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"],
        "num_key_value_heads": 8, "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 16, "v_head_dim": 64, "n_routed_experts": 16, "n_shared_experts": 1,
        "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
        "index_topk": 256, "index_n_heads": 8, "index_head_dim": 32,
        # index_topk_freq 2, index_skip_topk_offset 2: stages may start at layers 0, 1, 3, 5 (a V of
        # four virtual stages holds 1, 2, 2, 1 layers)
        "indexer_types": ["full", "full", "shared", "full", "shared", "full"],
        "num_nextn_predict_layers": 0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
}


__all__ = ["MAX_POSITIONS", "TINY_CONFIGS"]
