"""Rotary position embeddings as a Hugging Face ``config.json`` describes them.

:class:`RopeSpec` normalises the two spellings found in checkpoints (``rope_parameters``, or the
older ``rope_theta`` + ``rope_scaling``) and computes the inverse frequencies, the factor applied to
cos/sin (YaRN's attention factor) and the softmax-scale multiplier that DeepSeek's MLA derives from
``mscale_all_dim``. Supported types: ``default``, ``linear``, ``yarn``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from vpp.transformer.fused_ops import rotate_half, rotate_pairs

ROPE_TYPES = ("default", "linear", "yarn")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class RopeSpec:
    dim: int
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor_override: float | None = None
    truncate: bool = True

    @staticmethod
    def from_hf(cfg: dict, dim: int) -> "RopeSpec":
        """``dim``: the rotated width (head_dim, or qk_rope_head_dim for MLA)."""
        params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
        theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        if rope_type == "default":
            return RopeSpec(dim, theta)
        max_pos = cfg.get("max_position_embeddings", 0)
        original = int(cfg.get("original_max_position_embeddings")
                       or params.get("original_max_position_embeddings") or max_pos)
        factor = params.get("factor")
        factor = float(factor) if factor is not None else max_pos / original
        return RopeSpec(
            dim, theta, rope_type, factor, original,
            beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
            mscale=params.get("mscale"), mscale_all_dim=params.get("mscale_all_dim"),
            attention_factor_override=params.get("attention_factor"), truncate=params.get("truncate", True),
        )

    def inv_freq(self, device=None) -> torch.Tensor:
        if device is not None and torch.device(device).type == "meta":
            # a shape-only build: the same tensor's shape and dtype, computed on the CPU (arange and the
            # arithmetic on "meta" run torch's Python reference ops, whose first use imports torch._dynamo)
            return self.inv_freq().to("meta")
        exponents = torch.arange(0, self.dim, 2, dtype=torch.int64, device=device).float() / self.dim
        base = self.theta ** exponents
        if self.rope_type == "default":
            return 1.0 / base
        if self.rope_type == "linear":
            return 1.0 / base / self.factor
        # YaRN: interpolate low frequencies, keep high ones, linear ramp between the correction dims.
        low, high = (self._correction_dim(self.beta_fast), self._correction_dim(self.beta_slow))
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, self.dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(self.dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
        extrapolate = 1 - ramp
        return (1.0 / (self.factor * base)) * (1 - extrapolate) + (1.0 / base) * extrapolate

    def _correction_dim(self, rotations: float) -> float:
        return (self.dim * math.log(self.original_max_position_embeddings / (rotations * 2 * math.pi))) / (
            2 * math.log(self.theta))

    @property
    def attention_factor(self) -> float:
        """The factor cos and sin are multiplied by (YaRN's 'attention temperature')."""
        if self.rope_type != "yarn":
            return 1.0
        if self.attention_factor_override is not None:
            return float(self.attention_factor_override)
        if self.mscale and self.mscale_all_dim:
            return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim)
        return _yarn_mscale(self.factor)

    @property
    def softmax_mscale(self) -> float:
        """DeepSeek MLA multiplies its softmax scale by mscale(factor, mscale_all_dim)^2."""
        if self.rope_type == "default" or not self.mscale_all_dim:
            return 1.0
        return _yarn_mscale(self.factor, self.mscale_all_dim) ** 2


class RotaryEmbedding(nn.Module):
    """positions [c] -> (cos, sin), each [c, dim], in the model dtype."""

    def __init__(self, spec: RopeSpec, *, device=None):
        super().__init__()
        self.spec = spec
        self.register_buffer("inv_freq", spec.inv_freq(device), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        factor = self.spec.attention_factor
        return (emb.cos() * factor).to(dtype), (emb.sin() * factor).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split rotation (Llama/Qwen layout). x [c, heads, dim], cos/sin [c, dim]."""
    return rotate_half(x, cos, sin)


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pairwise rotation of (x0, x1), (x2, x3), ... (DeepSeek's weight layout). The result is written
    de-interleaved (all first members, then all second members); q and k get the same permutation, so
    their dot product is unchanged."""
    return rotate_pairs(x, cos, sin)


__all__ = ["ROPE_TYPES", "RopeSpec", "RotaryEmbedding", "apply_rope", "apply_rope_interleaved"]
