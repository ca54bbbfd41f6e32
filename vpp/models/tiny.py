"""Built-in tiny configurations: each family's real structure (same ``model_type``, MLA ranks, dense
first layer, group-limited routing, DSA indexer with shared layers, YaRN where the family uses it)
shrunk so that a 16K-token prefill runs on a CPU and attention dominates at long context, as in
the paper. Use them with ``build_stage(TINY_CONFIGS[name], ..., weights=random_checkpoint(...))``.

Per-chunk latency, one stage holding all layers, one CPU thread, 1K-token chunks over 16K tokens,
random weights, median of 3 runs (``python benchmarks/tiny_chunk_latency.py``):

    MEASURED_LATENCIES
"""

from __future__ import annotations

_COMMON = {
    "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 8,
    "num_attention_heads": 8, "moe_intermediate_size": 128, "num_experts_per_tok": 4, "norm_topk_prob": True,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
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
    # 128 (rope first, interleaved), index_topk 2048 (a quarter of a chunk), top-k shared by pairs of layers (IndexShare),
    # first layers dense, 256 experts in one group, 1 shared
    "tiny-glm": {
        **_COMMON, "model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"],
        "num_key_value_heads": 8, "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 16, "v_head_dim": 64, "n_routed_experts": 16, "n_shared_experts": 1,
        "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
        "index_topk": 256, "index_n_heads": 8, "index_head_dim": 32,
        "indexer_types": ["full" if i % 2 == 0 else "shared" for i in range(8)],
        "num_nextn_predict_layers": 0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
}
