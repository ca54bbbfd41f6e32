"""The DeepSeek-V3 family: MLA attention, ``first_k_dense_replace`` dense layers then MoE blocks
(sigmoid, group-limited, bias-corrected routing plus a shared expert).

* ``deepseek_v3``: MLA, RoPE layout per ``rope_interleave``; YaRN scaling with mscale in the
  softmax scale when ``rope_scaling`` says so.
* ``deepseek_v32``: MLA (interleaved RoPE) + DSA: a lightning indexer per layer (half-split RoPE)
  picks ``index_topk`` keys per query.
* ``glm_moe_dsa`` (GLM-5): as V3.2, with an interleaved-RoPE indexer, and ``indexer_types``: a
  ``"shared"`` layer has no indexer and reuses the top-k of the previous ``"full"`` layer. A stage
  must therefore start at a full layer (:func:`vpp.config.stage_starts`).

Configs come normalised from :func:`vpp.config.model_config` (defaults, ``indexer_types``,
``mlp_layer_types``); this module only builds layers and names their tensors.
"""

from __future__ import annotations

from vpp.config import DSA_TYPES, Config
from vpp.models.blocks import DecoderLayer, Shapes, build_mlp, mlp_tensors, norm_tensors
from vpp.transformer.attention import DSASpec, MLASpec, MLAttention, RopeSpec
from vpp.parallel.groups import ParallelGroups

MODEL_TYPES = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")


def rope_spec(cfg: Config) -> RopeSpec:
    return RopeSpec.from_hf(cfg, cfg["qk_rope_head_dim"])


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


__all__ = ["MODEL_TYPES", "build_layer", "layer_tensors", "rope_spec"]
