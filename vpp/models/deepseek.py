"""The DeepSeek-V3 family: MLA attention, ``first_k_dense_replace`` dense layers then MoE blocks
(sigmoid, group-limited, bias-corrected routing plus a shared expert).

* ``deepseek_v3``: MLA, RoPE layout per ``rope_interleave``; YaRN scaling with mscale in the
  softmax scale when ``rope_scaling`` says so.
* ``deepseek_v32``: MLA (interleaved RoPE) + DSA: a lightning indexer per layer (half-split RoPE)
  picks ``index_topk`` keys per query.
* ``glm_moe_dsa`` (GLM-5): as V3.2, with an interleaved-RoPE indexer, and ``indexer_types``: a
  ``"shared"`` layer has no indexer and reuses the top-k of the previous ``"full"`` layer. A stage
  must therefore start at a full layer (:func:`stage_starts`).
"""

from __future__ import annotations

from vpp.models.blocks import DecoderLayer, Shapes, mlp_tensors, norm_tensors
from vpp.models.config import Config, with_defaults
from vpp.parallel.attention import DSASpec, MLASpec, MLAttention, RopeSpec
from vpp.parallel.groups import ParallelGroups
from vpp.parallel.moe import build_mlp

MODEL_TYPES = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")
DSA_TYPES = ("deepseek_v32", "glm_moe_dsa")

# transformers 5.x class defaults for the keys read here (DeepSeek-V3; GLM-5 overrides a few)
DEFAULTS = {
    "vocab_size": 129280, "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
    "v_head_dim": 128, "rms_norm_eps": 1e-6, "attention_bias": False, "rope_interleave": True,
    "tie_word_embeddings": False, "max_position_embeddings": 4096,
    "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64, "num_nextn_predict_layers": 1,
}
GLM_DEFAULTS = {**DEFAULTS, "vocab_size": 154880, "hidden_size": 6144, "num_hidden_layers": 78,
                "num_attention_heads": 64, "q_lora_rank": 2048, "qk_nope_head_dim": 192, "v_head_dim": 256,
                "rms_norm_eps": 1e-5, "max_position_embeddings": 202752, "index_n_heads": 32}


def config(raw: dict) -> Config:
    cfg = with_defaults(raw, GLM_DEFAULTS if raw["model_type"] == "glm_moe_dsa" else DEFAULTS)
    if cfg["model_type"] != "deepseek_v3":
        cfg["rope_interleave"] = True  # V3.2 and GLM-5 always interleave MLA's rope dims
    if cfg["model_type"] in DSA_TYPES:
        cfg["indexer_types"] = indexer_types(cfg)
    return cfg


def indexer_types(cfg: Config) -> list[str]:
    """Per layer, ``"full"`` (own indexer) or ``"shared"`` (GLM-5: reuse the previous full layer's)."""
    n = cfg["num_hidden_layers"]
    if cfg["model_type"] != "glm_moe_dsa":
        return ["full"] * n
    if cfg.get("indexer_types"):
        types = list(cfg["indexer_types"])
    elif cfg.get("index_topk_pattern") is not None:
        pattern = cfg["index_topk_pattern"]
        types = [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
    else:
        freq, offset = max(cfg.get("index_topk_freq", 1), 1), cfg.get("index_skip_topk_offset", 2)
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if len(types) != n or types[0] != "full" or set(types) - {"full", "shared"}:
        raise ValueError(f"indexer_types must give 'full' or 'shared' for each of {n} layers, starting "
                         f"with 'full'; got {types}")
    return types


def rope_spec(cfg: Config) -> RopeSpec:
    return RopeSpec.from_hf(cfg, cfg["qk_rope_head_dim"])


def stage_starts(cfg: Config) -> list[int]:
    types = cfg.get("indexer_types") or ["full"] * cfg["num_hidden_layers"]
    return [i for i, t in enumerate(types) if t == "full"]


def build_layer(cfg: Config, layer: int, groups: ParallelGroups, *, dtype, device, moe_dispatch: str) -> DecoderLayer:
    kw = dict(dtype=dtype, device=device)
    spec = MLASpec(
        hidden_size=cfg["hidden_size"], num_heads=cfg["num_attention_heads"], q_lora_rank=cfg["q_lora_rank"],
        kv_lora_rank=cfg["kv_lora_rank"], qk_nope_head_dim=cfg["qk_nope_head_dim"],
        qk_rope_head_dim=cfg["qk_rope_head_dim"], v_head_dim=cfg["v_head_dim"],
        softmax_scale=(cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5 * rope_spec(cfg).softmax_mscale,
        rope_interleave=bool(cfg["rope_interleave"]), bias=cfg["attention_bias"],
    )
    dsa = None
    if cfg["model_type"] in DSA_TYPES:
        dsa = DSASpec(cfg["index_topk"], cfg["index_n_heads"], cfg["index_head_dim"],
                      rope_interleave=cfg["model_type"] == "glm_moe_dsa",
                      shared=cfg["indexer_types"][layer] == "shared")
    attn = MLAttention(spec, groups.tp, dsa=dsa, **kw)
    mlp = build_mlp(cfg, layer, groups, dispatch=moe_dispatch, **kw)
    return DecoderLayer(attn, mlp, cfg["hidden_size"], cfg["rms_norm_eps"], **kw)


def layer_tensors(cfg: Config, layer: int) -> Shapes:
    p, hidden, heads = f"model.layers.{layer}.self_attn.", cfg["hidden_size"], cfg["num_attention_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    r, q_r, rope = cfg["kv_lora_rank"], cfg["q_lora_rank"], cfg["qk_rope_head_dim"]
    if q_r is None:
        s = {f"{p}q_proj.weight": (heads * qk, hidden)}
    else:
        s = {f"{p}q_a_proj.weight": (q_r, hidden), f"{p}q_a_layernorm.weight": (q_r,),
             f"{p}q_b_proj.weight": (heads * qk, q_r)}
    s.update({f"{p}kv_a_proj_with_mqa.weight": (r + rope, hidden), f"{p}kv_a_layernorm.weight": (r,),
              f"{p}kv_b_proj.weight": (heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), r),
              f"{p}o_proj.weight": (hidden, heads * cfg["v_head_dim"])})
    if cfg["attention_bias"]:
        if q_r is not None:
            s[f"{p}q_a_proj.bias"] = (q_r,)
        s.update({f"{p}kv_a_proj_with_mqa.bias": (r + rope,), f"{p}o_proj.bias": (hidden,)})
    if cfg["model_type"] in DSA_TYPES and cfg["indexer_types"][layer] == "full":
        i, n, d = f"{p}indexer.", cfg["index_n_heads"], cfg["index_head_dim"]
        s.update({f"{i}wq_b.weight": (n * d, q_r), f"{i}wk.weight": (d, hidden), f"{i}k_norm.weight": (d,),
                  f"{i}k_norm.bias": (d,), f"{i}weights_proj.weight": (n, hidden)})
    return {**s, **norm_tensors(layer, hidden), **mlp_tensors(cfg, layer)}
