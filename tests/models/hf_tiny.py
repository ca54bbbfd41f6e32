"""Tiny random transformers models of each supported family, saved with ``save_pretrained``: the
independent reference for vpp's models. Imported only by the pytest process (spawned ranks never
import transformers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import transformers as tf

MODEL_TYPES = ("qwen3_moe", "deepseek_v3", "deepseek_v32", "glm_moe_dsa")
VOCAB = 96
PROMPTS = {"a": 37, "b": 29}  # token counts of the two test prompts
INDEX_TOPK = 8  # smaller than both prompts: DSA chunks past 8 tokens attend to 8 selected keys

_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
               num_hidden_layers=4, num_experts_per_tok=2, max_position_embeddings=256)
_MLA = dict(
    num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8,
    qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1,
    first_k_dense_replace=1, routed_scaling_factor=2.0,
    # YaRN with mscale != mscale_all_dim: both the cos/sin factor and the softmax mscale differ from 1
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
                     "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0},
)
# >= 16 indexer heads: with few heads relu leaves exact-zero ties at the top-k boundary
_DSA = dict(index_topk=INDEX_TOPK, index_n_heads=16, index_head_dim=16)


def config(model_type: str, index_topk_freq: int = 2, **overrides):
    """The tiny config of ``model_type``; ``overrides`` replace any of its keys (widths, the number of
    layers, MLA ranks, routing, index_topk, ...); GLM-5 shares indexers every ``index_topk_freq``-th
    layer (1: none)."""
    if model_type == "qwen3_moe":
        # one KV head: at TP = 2 each rank holds a replica of it; layer 0 is dense (mlp_only_layers)
        return tf.Qwen3MoeConfig(**{**_COMMON, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
                                    "num_experts": 8, "norm_topk_prob": True, "mlp_only_layers": [0], **overrides})
    if model_type == "deepseek_v3":
        return tf.DeepseekV3Config(**{**_COMMON, **_MLA, **overrides})
    if model_type == "deepseek_v32":
        return tf.DeepseekV32Config(**{**_COMMON, **_MLA, **_DSA, **overrides})
    # GLM-5 IndexShare: with 4 layers and freq 2, indexer_types = full, full, shared, full (offset 2)
    return tf.GlmMoeDsaConfig(**{**_COMMON, **_MLA, **_DSA, "index_topk_freq": index_topk_freq, **overrides})


def model(model_type: str, seed: int = 0, **config_kw):
    """A random model whose weights are O(1/sqrt(fan_in)) (the default 0.02 init makes attention
    nearly uniform, which would hide mask and RoPE bugs), with non-trivial norms and router biases."""
    torch.manual_seed(seed)
    cfg = config(model_type, **config_kw)
    m = tf.AutoModelForCausalLM.from_config(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() >= 2:
                std = 1.0 if "embed_tokens" in name else p.shape[-1] ** -0.5
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif "norm" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
        for name, b in m.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    return m


@dataclass
class Case:
    """A saved model and transformers' logits for each prompt (one full forward, fp32)."""

    model_type: str
    path: str
    prompts: dict[str, torch.Tensor]
    logits: dict[str, torch.Tensor]


def saved_with_greedy(root: Path, model_types, prompt: torch.Tensor, new_tokens: int, **config_kw) -> dict:
    """Each family saved under ``root`` with its greedy continuation of ``prompt`` (transformers'
    ``generate``, no EOS): ``{model_type: (directory, new token ids, config dict)}``."""
    out = {}
    for model_type in model_types:
        m = model(model_type, **config_kw)
        m.save_pretrained(root / model_type)
        with torch.no_grad():
            seq = m.generate(prompt[None], attention_mask=torch.ones_like(prompt)[None], max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0, eos_token_id=None)
        out[model_type] = (str(root / model_type), seq[0, prompt.numel():].tolist(), m.config.to_dict())
    return out


def make_case(model_type: str, root: Path) -> Case:
    m = model(model_type)
    path = root / model_type
    m.save_pretrained(path)
    g = torch.Generator().manual_seed(1)
    prompts = {name: torch.randint(0, VOCAB, (n,), generator=g) for name, n in PROMPTS.items()}
    with torch.no_grad():
        logits = {name: m(ids[None]).logits[0] for name, ids in prompts.items()}
    return Case(model_type, str(path), prompts, logits)
