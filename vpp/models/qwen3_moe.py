"""Qwen3-MoE: GQA with per-head q/k RMSNorm and RoPE, MoE blocks (softmax top-k routing, no shared
expert) on every ``decoder_sparse_step``-th layer outside ``mlp_only_layers``, dense MLP elsewhere."""

from __future__ import annotations

from vpp.config import Config
from vpp.models.blocks import DecoderLayer, Shapes, build_mlp, mlp_tensors, norm_tensors
from vpp.transformer.attention import GQAttention, RopeSpec
from vpp.parallel.groups import ParallelGroups

MODEL_TYPES = ("qwen3_moe",)


def rope_spec(cfg: Config) -> RopeSpec:
    return RopeSpec.from_hf(cfg, cfg["head_dim"])


def build_layer(cfg: Config, layer: int, groups: ParallelGroups, *, dtype, device, moe_dispatch: str) -> DecoderLayer:
    kw = dict(dtype=dtype, device=device)
    attn = GQAttention(cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                       groups.tp, eps=cfg["rms_norm_eps"], bias=cfg["attention_bias"], **kw)
    mlp = build_mlp(cfg, layer, groups, dispatch=moe_dispatch, **kw)
    return DecoderLayer(attn, mlp, cfg["hidden_size"], cfg["rms_norm_eps"], **kw)


def layer_tensors(cfg: Config, layer: int) -> Shapes:
    p, hidden, d = f"model.layers.{layer}.self_attn.", cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes = {f"{p}q_proj.weight": (q, hidden), f"{p}k_proj.weight": (kv, hidden),
              f"{p}v_proj.weight": (kv, hidden), f"{p}o_proj.weight": (hidden, q),
              f"{p}q_norm.weight": (d,), f"{p}k_norm.weight": (d,)}
    if cfg["attention_bias"]:
        shapes.update({f"{p}q_proj.bias": (q,), f"{p}k_proj.bias": (kv,), f"{p}v_proj.bias": (kv,),
                       f"{p}o_proj.bias": (hidden,)})
    return {**shapes, **norm_tensors(layer, hidden), **mlp_tensors(cfg, layer)}


__all__ = ["MODEL_TYPES", "build_layer", "layer_tensors", "rope_spec"]
