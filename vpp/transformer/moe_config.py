"""What an MoE layer computes (:class:`MoEConfig`): the routing of the supported families.

===============  =========  ===============================================================
family           scoring    selection
===============  =========  ===============================================================
Qwen3-MoE        softmax    top-k of softmax(x W_r^T); optional renormalisation (norm_topk_prob)
DeepSeek-V3/V32  sigmoid    s = sigmoid(x W_r^T); keep the topk_group of n_group expert groups
GLM-5                       whose two best (s + b) sum highest, then top-k of (s + b) inside them;
                            weights are s (not s + b), renormalised, times routed_scaling_factor
===============  =========  ===============================================================

DeepSeek and GLM add a shared expert (``n_shared_experts`` experts fused into one MLP of
``moe_intermediate_size * n_shared_experts``). No family here has a gate on its shared expert
(Qwen2-MoE's sigmoid ``shared_expert_gate``). Reading these fields from a Hugging Face config is the
models' job (:func:`vpp.models.blocks.moe_config`); this module knows no checkpoint format.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch.nn.functional as F

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu}

@dataclass(frozen=True)
class MoEConfig:
    """One MoE layer: ``num_experts`` SwiGLU experts of ``moe_intermediate_size``, ``top_k`` per token.

    ``shared_intermediate_size`` is the width of the always-on shared expert (0: none).
    ``shared_gate`` (a sigmoid gate on the shared expert, Qwen2-MoE) is not used by any supported
    family and is rejected.
    """

    hidden_size: int
    moe_intermediate_size: int
    num_experts: int
    top_k: int
    scoring: str = "softmax"
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    correction_bias: bool = False
    shared_intermediate_size: int = 0
    shared_gate: bool = False
    hidden_act: str = "silu"

    def __post_init__(self) -> None:
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"scoring={self.scoring!r} must be 'softmax' or 'sigmoid'")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act={self.hidden_act!r} is not one of {sorted(ACTIVATIONS)}")
        if self.shared_gate:
            raise ValueError("shared_gate=True (a sigmoid gate on the shared expert) is not implemented")
        if self.num_experts % self.n_group:
            raise ValueError(f"num_experts={self.num_experts} is not divisible by n_group={self.n_group}")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"topk_group={self.topk_group} must lie in 1..n_group={self.n_group}")
        if self.scoring == "softmax" and (self.n_group > 1 or self.correction_bias):
            raise ValueError(
                f"group-limited routing (n_group={self.n_group}) and the score correction bias "
                f"(correction_bias={self.correction_bias}) are implemented for scoring='sigmoid' only"
            )
        eligible = self.topk_group * (self.num_experts // self.n_group)
        if not 1 <= self.top_k <= eligible:
            raise ValueError(
                f"top_k={self.top_k} must lie in 1..{eligible} (topk_group={self.topk_group} groups of "
                f"{self.num_experts // self.n_group} experts)"
            )


__all__ = ["ACTIVATIONS", "MoEConfig"]
