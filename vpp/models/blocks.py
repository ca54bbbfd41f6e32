"""Blocks shared by every family: the pre-norm decoder layer and the checkpoint tensor names
(with their full, unsharded shapes) of the embedding, head and MLP blocks."""

from __future__ import annotations

import torch
from torch import nn

from vpp.parallel.attention import Chunk
from vpp.parallel.basic import RMSNorm
from vpp.parallel.moe import MoEConfig, is_moe_layer

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
    if not is_moe_layer(cfg, layer):
        return _swiglu(p, hidden, cfg["intermediate_size"])
    moe = MoEConfig.from_hf(cfg)
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
