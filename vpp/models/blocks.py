"""Blocks shared by every family: the pre-norm decoder layer, the MLP block of a layer (dense or MoE,
as the config's ``mlp_layer_types`` says) and the checkpoint tensor names (with their full, unsharded
shapes) of the embedding, head and MLP blocks."""

from __future__ import annotations

import torch
from torch import nn

from vpp.config import Config, num_experts, shared_intermediate_size
from vpp.transformer.attention import Chunk
from vpp.transformer.basic import RMSNorm
from vpp.parallel.groups import ParallelGroups
from vpp.transformer.mlp import DenseMLP
from vpp.transformer.moe import MoE, MoEConfig

Shapes = dict[str, tuple[int, ...]]


class DecoderLayer(nn.Module):
    """h = h + attn(norm1(h)); h = h + mlp(norm2(h)). Input and output replicated over TP."""

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, hidden_size: int, eps: float, *,
                 dtype=None, device=None):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, eps, dtype=dtype, device=device)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(hidden_size, eps, dtype=dtype, device=device)
        self.mlp = mlp

    def forward(self, h: torch.Tensor, chunk: Chunk) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), chunk)
        return h + self.mlp(self.post_attention_layernorm(h))


def moe_config(cfg: Config) -> MoEConfig:
    """The MoE block of a normalised config (:func:`vpp.config.model_config`)."""
    common = dict(hidden_size=cfg["hidden_size"], moe_intermediate_size=cfg["moe_intermediate_size"],
                  num_experts=num_experts(cfg), top_k=cfg["num_experts_per_tok"],
                  norm_topk_prob=bool(cfg["norm_topk_prob"]), hidden_act=cfg["hidden_act"])
    if cfg["model_type"] == "qwen3_moe":
        return MoEConfig(scoring="softmax", **common)
    return MoEConfig(scoring="sigmoid", routed_scaling_factor=float(cfg["routed_scaling_factor"]),
                     n_group=cfg["n_group"] or 1, topk_group=cfg["topk_group"] or 1, correction_bias=True,
                     shared_intermediate_size=shared_intermediate_size(cfg), **common)


def build_mlp(cfg: Config, layer: int, groups: ParallelGroups, *, dispatch: str = "allreduce",
              dtype: torch.dtype | None = None, device=None) -> nn.Module:
    """The MLP block of global layer ``layer``: :class:`MoE` where ``mlp_layer_types`` says "sparse",
    else a :class:`DenseMLP` of ``intermediate_size`` over the TP group. Both have
    ``load_checkpoint(get_tensor, prefix)`` with prefix ``f"model.layers.{layer}.mlp."``."""
    if cfg["mlp_layer_types"][layer] == "sparse":
        return MoE(moe_config(cfg), groups, dispatch=dispatch, dtype=dtype, device=device)
    return DenseMLP(cfg["hidden_size"], cfg["intermediate_size"], groups.tp, hidden_act=cfg["hidden_act"],
                    dtype=dtype, device=device)


def global_tensors(cfg: dict) -> Shapes:
    """Names outside the layers: embedding, final norm and (unless tied) the LM head."""
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def mlp_tensors(cfg: dict, layer: int) -> Shapes:
    """The MLP block of ``layer``: a dense SwiGLU MLP, or the router, experts and shared expert."""
    p, hidden = f"model.layers.{layer}.mlp.", cfg["hidden_size"]
    if cfg["mlp_layer_types"][layer] != "sparse":
        return _swiglu(p, hidden, cfg["intermediate_size"])
    moe = moe_config(cfg)
    shapes = {f"{p}gate.weight": (moe.num_experts, hidden)}
    if moe.correction_bias:
        shapes[f"{p}gate.e_score_correction_bias"] = (moe.num_experts,)
    for e in range(moe.num_experts):
        shapes.update(_swiglu(f"{p}experts.{e}.", hidden, moe.moe_intermediate_size))
    if moe.shared_intermediate_size:
        shapes.update(_swiglu(f"{p}shared_experts.", hidden, moe.shared_intermediate_size))
    return shapes


def norm_tensors(layer: int, hidden: int) -> Shapes:
    p = f"model.layers.{layer}."
    return {f"{p}input_layernorm.weight": (hidden,), f"{p}post_attention_layernorm.weight": (hidden,)}


def _swiglu(prefix: str, hidden: int, inter: int) -> Shapes:
    return {f"{prefix}gate_proj.weight": (inter, hidden), f"{prefix}up_proj.weight": (inter, hidden),
            f"{prefix}down_proj.weight": (hidden, inter)}


__all__ = [
    "DecoderLayer", "Shapes", "build_mlp", "global_tensors", "mlp_tensors", "moe_config", "norm_tensors",
]
