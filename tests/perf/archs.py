"""Small configurations shared by the cost-model tests: every shape key given, dimensions small
enough to count FLOPs and bytes by hand, and a made-up device with round numbers."""

from vpp.perf.hardware import Device

TINY_MLA = {"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 48, "moe_intermediate_size": 16,
            "num_hidden_layers": 2, "first_k_dense_replace": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
            "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
            "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "vocab_size": 100}
TINY_DSA = {**TINY_MLA, "model_type": "glm_moe_dsa", "index_topk": 8, "index_head_dim": 8, "index_n_heads": 2}
TINY_GQA = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 48, "moe_intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 100}

DEV = Device("test", peak_flops=1e12, mem_bw=1e11, mem_bytes=1e10, link_bw=1e10, lowp_speedup=2.0,
             eff_matmul=0.5, eff_attn=0.25, eff_mem=0.5, eff_link=0.5, link_latency=1e-6, kernel_overhead=2e-6)
