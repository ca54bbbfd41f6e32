"""What a transformer layer computes, built from :mod:`vpp.parallel`'s tensor-parallel pieces:
attention (GQA, MLA, DSA sparse) with per-request caches, the MoE router, expert-parallel MoE, the
dense MLP and the replicated blocks (RMSNorm). No checkpoint format and no model family: those are
:mod:`vpp.models`' (as Megatron-core keeps ``transformer/`` apart from ``tensor_parallel/``)."""

from vpp.transformer.basic import RMSNorm, linear
from vpp.transformer.mlp import DenseMLP
from vpp.transformer.moe import MoE
from vpp.transformer.moe_config import MoEConfig
from vpp.transformer.router import Router

__all__ = ["DenseMLP", "MoE", "MoEConfig", "RMSNorm", "Router", "linear"]
