"""Replicated building blocks: RMSNorm, an uninitialised ``nn.Linear`` (weights come from a
checkpoint, so the random init that ``nn.Linear`` would run is skipped), and the finite check of a
layer's output."""

from __future__ import annotations

import torch
from torch import nn

from vpp.transformer.fused_ops import rms_norm


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * w, computed in fp32 and cast back (as Hugging Face does)."""

    def __init__(self, dim: int, eps: float = 1e-6, *, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)  # the device's fused kernel where it has one

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def linear(in_features: int, out_features: int, *, bias: bool = False,
           dtype: torch.dtype | None = None, device=None) -> nn.Linear:
    """A replicated ``nn.Linear`` whose parameters are allocated but not initialised."""
    if device is None:  # skip_init would leave the parameters on the meta device
        device = torch.get_default_device()
    layer = nn.utils.skip_init(nn.Linear, in_features, out_features, bias=bias, dtype=dtype, device=device)
    layer.requires_grad_(False)
    return layer


__all__ = ["RMSNorm", "linear"]


def all_finite(h: torch.Tensor) -> torch.Tensor:
    """A device flag: every element of ``h`` is finite. One reduction pass (``aminmax`` propagates NaN,
    and an infinity is the min or the max), about 10x cheaper on CPU than ``isfinite(h).all()``, which
    makes a boolean tensor of h's size first (and, on CPU, three more passes: eq, abs, ne)."""
    if h.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=h.device)
    return torch.isfinite(torch.stack(torch.aminmax(h))).all()
