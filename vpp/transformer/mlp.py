"""The dense SwiGLU MLP, tensor-parallel: dense layers of MoE models and the MoE shared expert."""

from __future__ import annotations

import torch
from torch import nn

from vpp.parallel.groups import Group
from vpp.parallel.layers import ColumnParallelLinear, RowParallelLinear
from vpp.transformer.fused_ops import gated
from vpp.transformer.moe_config import ACTIVATIONS
from vpp.parallel.sharding import ReadSlice, SliceLoader, shard_spec_of


class DenseMLP(nn.Module):
    """Y = (act(X G^T) * (X U^T)) D^T, with G and U split along their rows (intermediate dim) over the
    group (column parallel) and D along its columns (row parallel): rank i computes
    (act(X G_i^T) * (X U_i^T)) D_i^T, and the partial results are summed.

    With ``reduce_output=False`` the caller sums the partials (the MoE folds them into its own
    reduction). Parameter names match the checkpoint's (``gate_proj.weight``, ``up_proj.weight``,
    ``down_proj.weight``).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, group: Group, *, hidden_act: str = "silu",
                 reduce_output: bool = True, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        if hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act={hidden_act!r} is not one of {sorted(ACTIVATIONS)}")
        self.act = ACTIVATIONS[hidden_act]
        self.gate_proj = ColumnParallelLinear(hidden_size, intermediate_size, group, dtype=dtype, device=device)
        self.up_proj = ColumnParallelLinear(hidden_size, intermediate_size, group, dtype=dtype, device=device)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, group, input_is_parallel=True,
                                           reduce_output=reduce_output, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gated(self.act, self.gate_proj(x), self.up_proj(x)))

    def checkpoint_names(self, prefix: str = "") -> list[str]:
        return [f"{prefix}{name}" for name, _ in self.named_parameters()]

    def load_checkpoint(self, read: ReadSlice, prefix: str = "") -> None:
        """Load this rank's shards, ``read(prefix + "gate_proj.weight", shard)`` etc.: each tensor's
        slice is read and copied before the next is read. Missing tensors raise a KeyError that names
        them all."""
        loader = SliceLoader(read, f"DenseMLP at {prefix!r}")
        self.load_into(loader, prefix)
        loader.finish()

    def load_into(self, loader: SliceLoader, prefix: str = "") -> None:
        """Queue this block's tensors on ``loader`` (the MoE loads its shared expert this way)."""
        for name, param in self.named_parameters():
            loader.copy(param, prefix + name, shard_spec_of(self, name))


__all__ = ["DenseMLP"]
