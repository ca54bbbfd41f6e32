"""Top-k expert selection: which ``k`` of ``E`` experts each token visits, and with what weight.

The selection functions are pure (logits in, weights and expert ids out) so they are tested without
a process group. :class:`Router` holds the replicated router weight W_r [E, H] (and DeepSeek's score
correction bias b [E]) and applies the one that :class:`~vpp.transformer.moe_config.MoEConfig` names.

Precision follows the reference implementations: softmax routing takes logits in the input dtype
and the softmax in fp32, and returns weights in the input dtype; sigmoid routing computes logits,
scores and weights in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vpp.transformer.fused_ops import sigmoid_gating, softmax_gating
from vpp.transformer.moe_config import MoEConfig


def softmax_topk(logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """p = softmax(logits) in fp32; keep the ``top_k`` largest p per row (renormalised to sum to 1
    when ``norm_topk_prob``). Returns (weights [T, k] fp32, expert ids [T, k] int64)."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def sigmoid_group_topk(
    logits: torch.Tensor,
    top_k: int,
    *,
    bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
    norm_topk_prob: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's bias-corrected, group-limited selection ("noaux_tc").

    s = sigmoid(logits); c = s + bias chooses, s weighs. The E experts form ``n_group`` contiguous
    groups; a group's score is the sum of its two largest c; only the ``topk_group`` best groups
    stay eligible, and the ``top_k`` largest c among their experts are chosen. The weights are the
    chosen s, divided by their sum (+1e-20) when ``norm_topk_prob``. Returns (weights [T, k] fp32,
    expert ids [T, k] int64).
    """
    scores = torch.sigmoid(logits.float())
    choice = scores if bias is None else scores + bias.float()
    if topk_group < n_group:
        tokens, experts = choice.shape
        grouped = choice.view(tokens, n_group, experts // n_group)
        group_score = grouped.topk(min(2, experts // n_group), dim=-1).values.sum(dim=-1)
        best_groups = group_score.topk(topk_group, dim=-1).indices
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best_groups, True)
        choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(tokens, experts)
    ids = torch.topk(choice, top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights, ids


class Router(nn.Module):
    """logits = X W_r^T over all E experts (W_r replicated on every rank), then top-k selection.

    ``forward(x [T, H])`` returns (weights [T, k], expert ids [T, k]); the weights already include
    ``routed_scaling_factor``. Sigmoid routing keeps fp32 weights, softmax routing returns them in
    the input dtype (as the reference implementations multiply expert outputs by them).
    """

    def __init__(self, cfg: MoEConfig, *, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, dtype=dtype, device=device),
                                   requires_grad=False)
        bias = torch.zeros(cfg.num_experts, dtype=torch.float32, device=device) if cfg.correction_bias else None
        self.e_score_correction_bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        scale = cfg.routed_scaling_factor
        if cfg.scoring == "softmax":
            logits = F.linear(x, self.weight)
            fused = softmax_gating(logits, cfg.top_k)  # the device's fused softmax + top-k, where it has one
            if fused is not None:
                weights, ids = fused
                if cfg.norm_topk_prob:
                    weights = weights / weights.sum(dim=-1, keepdim=True)
            else:
                weights, ids = softmax_topk(logits, cfg.top_k, cfg.norm_topk_prob)
            weights = weights.to(x.dtype)
        else:
            logits = F.linear(x.float(), self.weight.float())
            fused = None if not cfg.norm_topk_prob else sigmoid_gating(
                logits, cfg.top_k, bias=self.e_score_correction_bias, n_group=cfg.n_group,
                topk_group=cfg.topk_group, scaling=scale)
            if fused is not None:
                return fused  # its weights are renormalised and scaled already
            weights, ids = sigmoid_group_topk(
                logits, cfg.top_k, bias=self.e_score_correction_bias,
                n_group=cfg.n_group, topk_group=cfg.topk_group, norm_topk_prob=cfg.norm_topk_prob,
            )
        if scale != 1.0:
            weights = weights * scale
        return weights, ids

    def extra_repr(self) -> str:
        c = self.cfg
        return (f"experts={c.num_experts}, top_k={c.top_k}, scoring={c.scoring}, groups={c.topk_group}/{c.n_group}, "
                f"bias={c.correction_bias}, scale={c.routed_scaling_factor}")


__all__ = ["Router", "sigmoid_group_topk", "softmax_topk"]
