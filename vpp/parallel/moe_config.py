"""What an MoE layer computes, read from a Hugging Face ``config.json``, and which layers are MoE.

:class:`MoEConfig` covers the routing of the supported families:

===============  =========  ===============================================================
family           scoring    selection
===============  =========  ===============================================================
qwen3_moe        softmax    top-k of softmax(x W_r^T); optional renormalisation (norm_topk_prob)
deepseek_v3/v32  sigmoid    s = sigmoid(x W_r^T); keep the topk_group of n_group expert groups
glm_moe_dsa                 whose two best (s + b) sum highest, then top-k of (s + b) inside them;
                            weights are s (not s + b), renormalised, times routed_scaling_factor
===============  =========  ===============================================================

DeepSeek and GLM add a shared expert (``n_shared_experts`` experts fused into one MLP of
``moe_intermediate_size * n_shared_experts``). The block code of deepseek_v3, deepseek_v32 and
glm_moe_dsa is the same in transformers 5.x; they differ only in configuration defaults (GLM-5 uses
one group). No family here has a gate on its shared expert (Qwen2-MoE's sigmoid ``shared_expert_gate``).

:func:`is_moe_layer` says which layers are MoE: Qwen3 ``mlp_only_layers`` and ``decoder_sparse_step``;
DeepSeek-V3 ``first_k_dense_replace`` (and ``moe_layer_freq``, 1 in every released checkpoint);
DeepSeek-V3.2 / GLM ``mlp_layer_types`` when given, else ``first_k_dense_replace``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch.nn.functional as F

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu}

# Defaults of the transformers 5.x configuration classes, under their config.json keys: a key missing
# from a config.json means the class default (tests compare this table with the classes themselves).
_DEEPSEEK = {
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "first_k_dense_replace": 3, "hidden_act": "silu",
}
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "norm_topk_prob": False, "decoder_sparse_step": 1, "hidden_act": "silu",
    },
    "deepseek_v3": _DEEPSEEK,
    "deepseek_v32": _DEEPSEEK,
    "glm_moe_dsa": {
        **_DEEPSEEK, "hidden_size": 6144, "intermediate_size": 12288, "n_group": 1, "topk_group": 1,
    },
}


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

    @property
    def experts_per_group(self) -> int:
        return self.num_experts // self.n_group

    @classmethod
    def from_hf(cls, config: Mapping[str, Any] | Any) -> "MoEConfig":
        """Read a Hugging Face ``config.json`` (a dict, or a transformers config object) of
        ``model_type`` qwen3_moe, deepseek_v3, deepseek_v32 or glm_moe_dsa."""
        hf, family = _with_defaults(config)
        if family == "qwen3_moe":
            return cls(
                hidden_size=hf["hidden_size"], moe_intermediate_size=hf["moe_intermediate_size"],
                num_experts=hf["num_experts"], top_k=hf["num_experts_per_tok"],
                scoring="softmax", norm_topk_prob=bool(hf["norm_topk_prob"]), hidden_act=hf["hidden_act"],
            )
        scoring = hf.get("scoring_func", "sigmoid")
        method = hf.get("topk_method", "noaux_tc")
        if scoring != "sigmoid" or method != "noaux_tc":
            raise ValueError(
                f"model_type={family!r} with scoring_func={scoring!r}, topk_method={method!r}: only "
                f"sigmoid scoring with noaux_tc (bias-corrected, group-limited) top-k is supported"
            )
        return cls(
            hidden_size=hf["hidden_size"], moe_intermediate_size=hf["moe_intermediate_size"],
            num_experts=hf["n_routed_experts"], top_k=hf["num_experts_per_tok"],
            scoring="sigmoid", norm_topk_prob=bool(hf["norm_topk_prob"]),
            routed_scaling_factor=float(hf["routed_scaling_factor"]),
            n_group=hf["n_group"] or 1, topk_group=hf["topk_group"] or 1, correction_bias=True,
            shared_intermediate_size=hf["moe_intermediate_size"] * (hf["n_shared_experts"] or 0),
            hidden_act=hf["hidden_act"],
        )


def is_moe_layer(config: Mapping[str, Any] | Any, layer: int) -> bool:
    """Whether global layer ``layer`` of this Hugging Face config has an MoE block (else a dense MLP
    of ``intermediate_size``)."""
    hf, family = _with_defaults(config)
    num_layers = hf.get("num_hidden_layers")
    if num_layers is not None and not 0 <= layer < num_layers:
        raise ValueError(f"layer {layer} outside num_hidden_layers={num_layers}")
    if family == "qwen3_moe":
        step = hf["decoder_sparse_step"]
        return layer not in (hf.get("mlp_only_layers") or []) and hf["num_experts"] > 0 and (layer + 1) % step == 0
    if hf.get("mlp_layer_types") is not None:  # deepseek_v32 / glm_moe_dsa spell it out per layer
        return hf["mlp_layer_types"][layer] == "sparse"
    return layer >= hf["first_k_dense_replace"] and layer % (hf.get("moe_layer_freq") or 1) == 0


def _with_defaults(config: Mapping[str, Any] | Any) -> tuple[dict[str, Any], str]:
    hf = dict(config) if isinstance(config, Mapping) else config.to_dict()
    family = hf.get("model_type")
    if family not in HF_DEFAULTS:
        raise ValueError(f"model_type={family!r} is not one of {sorted(HF_DEFAULTS)}")
    given = {k: v for k, v in hf.items() if v is not None}
    # transformers 5.x writes num_local_experts for both families; released checkpoints use the
    # family's own key (qwen3_moe: num_experts, deepseek/glm: n_routed_experts)
    experts_key = "num_experts" if family == "qwen3_moe" else "n_routed_experts"
    if "num_local_experts" in given:
        given.setdefault(experts_key, given.pop("num_local_experts"))
    return {**HF_DEFAULTS[family], **given}, family
