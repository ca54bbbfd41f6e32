"""Architecture configs of the paper's three models, written out as Hugging Face ``config.json`` dicts.

Only the fields that shape compute, memory and communication are kept (no tokenizer ids, no rope
scaling details beyond what a cost model needs). Sources:

* ``DEEPSEEK_V3_1`` -- deepseek-ai/DeepSeek-V3.1(-Terminus) ``config.json`` (model_type deepseek_v3):
  61 layers, the first 3 dense, MLA (q_lora 1536, kv_lora 512, nope 128 + rope 64, v 128, 128 heads),
  256 routed experts top-8 plus 1 shared, moe_intermediate 2048, vocab 129280. 671B total / 37B active.
* ``GLM_5_2`` -- the GLM-5 architecture (model_type glm_moe_dsa; transformers' ``GlmMoeDsaConfig``
  defaults, checkpoint zai-org/GLM-5): 78 layers, the first 3 dense, hidden 6144, MLA (q_lora 2048,
  kv_lora 512, nope 192 + rope 64, v 256, 64 heads) with the DSA lightning indexer (32 heads x 128,
  top-2048 tokens), 256 routed experts top-8 plus 1 shared, moe_intermediate 2048, vocab 154880.
  744B total / 40B active. GLM-5.2 is taken to share GLM-5's architecture (the paper gives its sizes,
  744B / 40B / 256 experts, which match).
* ``QWEN3_CODER_30B_A3B`` -- Qwen/Qwen3-Coder-30B-A3B-Instruct ``config.json`` (model_type qwen3_moe):
  48 layers, hidden 2048, GQA 32 query / 4 KV heads of 128, 128 experts top-8, moe_intermediate 768,
  vocab 151936. 30.5B total / 3.3B active.
* ``LLAMA3_405B`` -- meta-llama/Llama-3.1-405B ``config.json`` (model_type llama, which the HF reader does
  not support, so it is an :class:`~.arch.Arch` directly): dense, 126 layers, hidden 16384, GQA 128
  query / 8 KV heads of 128, SwiGLU FFN 53248, vocab 128256. The context-parallelism anchor's model.
"""

from __future__ import annotations

import copy
import json
import os

from .arch import Arch

DEEPSEEK_V3_1: dict = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "num_nextn_predict_layers": 1,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

GLM_5_2: dict = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "hidden_size": 6144,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 78,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "q_lora_rank": 2048,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "num_nextn_predict_layers": 1,
    "vocab_size": 154880,
    "max_position_embeddings": 202752,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

QWEN3_CODER_30B_A3B: dict = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "vocab_size": 151936,
    "max_position_embeddings": 262144,
    "rope_theta": 10000000,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

LLAMA3_405B = Arch.dense_gqa("llama3-405b", hidden=16384, layers=126, vocab=128256, heads=128, kv_heads=8,
                              ffn=53248)
ARCHS: dict[str, Arch] = {"llama3-405b": LLAMA3_405B}

CONFIGS: dict[str, dict] = {
    "deepseek-v3.1": DEEPSEEK_V3_1,
    "glm-5.2": GLM_5_2,
    "qwen3-coder-30b-a3b": QWEN3_CODER_30B_A3B,
}
ALIASES = {"deepseek": "deepseek-v3.1", "glm": "glm-5.2", "qwen": "qwen3-coder-30b-a3b",
           "qwen3-30b-a3b": "qwen3-coder-30b-a3b"}


def canonical_name(name: str) -> str:
    """The registry key of a model name or alias (unchanged if it is neither, e.g. a path)."""
    key = ALIASES.get(name.lower(), name.lower())
    return key if key in CONFIGS else name


def get_arch(name: str) -> Arch:
    """The cost model's view of a named model: a paper model read through the HF reader, or one of
    :data:`ARCHS` (dense models the reader does not cover), or a config.json path."""
    key = name.lower()
    if key in ARCHS:
        return ARCHS[key]
    return Arch.from_config(get_config(name), name=canonical_name(name))


def get_config(name: str) -> dict:
    """A copy of a named config (``deepseek-v3.1``, ``glm-5.2``, ``qwen3-coder-30b-a3b`` or a short
    alias), or of a ``config.json`` at a path (a file or a model directory)."""
    key = ALIASES.get(name.lower(), name.lower())
    if key in CONFIGS:
        return copy.deepcopy(CONFIGS[key])
    path = os.path.join(name, "config.json") if os.path.isdir(name) else name
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    raise KeyError(f"unknown model {name!r}: choose one of {sorted(CONFIGS)} (aliases {sorted(ALIASES)}) "
                   f"or give a config.json path")


__all__ = [
    "ALIASES", "ARCHS", "CONFIGS", "DEEPSEEK_V3_1", "GLM_5_2", "LLAMA3_405B", "QWEN3_CODER_30B_A3B",
    "canonical_name", "get_arch", "get_config",
]
