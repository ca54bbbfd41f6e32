"""Tensor-parallel layers (inference). Each declares how its parameters are sharded
(``shard_specs``), so an unsharded checkpoint loads into any TP size."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vpp.parallel.comm import gather_from_tp, reduce_from_tp, scatter_to_tp
from vpp.parallel.groups import Group
from vpp.parallel.sharding import Shard, split_size


def _empty(*shape: int, dtype: torch.dtype | None, device: torch.device | str | None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    """Y = X A + b, with A split along its columns over the TP group: A = [A_1, ..., A_p].

    Rank i holds A_i (``weight`` of shape [out/p, in], as ``nn.Linear`` stores it) and b_i, and
    computes Y_i = X A_i + b_i. With ``gather_output=True`` the Y_i are all-gathered into Y on every
    rank; otherwise each rank keeps its Y_i (the input of a :class:`RowParallelLinear`).
    """

    def __init__(self, in_features: int, out_features: int, group: Group, *, bias: bool = False,
                 gather_output: bool = False, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.group, self.gather_output = group, gather_output
        self.in_features, self.out_features = in_features, out_features
        local = split_size(out_features, group.size, "ColumnParallelLinear out_features")
        self.weight = _empty(local, in_features, dtype=dtype, device=device)
        self.bias = _empty(local, dtype=dtype, device=device) if bias else None
        self.shard_specs = {"weight": Shard(0, group.rank, group.size), "bias": Shard(0, group.rank, group.size)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return gather_from_tp(y, self.group, dim=-1) if self.gather_output else y

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, tp={self.group.size}, gather_output={self.gather_output}"


class RowParallelLinear(nn.Module):
    """Y = X A + b, with A split along its rows over the TP group: A = [A_1; ...; A_p], X = [X_1, ..., X_p].

    Rank i holds A_i (``weight`` of shape [out, in/p]) and computes X_i A_i; the partial products are
    summed by an all-reduce, then b is added once. With ``input_is_parallel=True`` the input already
    is X_i (the output of a :class:`ColumnParallelLinear`); otherwise the full X is sliced here.
    """

    def __init__(self, in_features: int, out_features: int, group: Group, *, bias: bool = False,
                 input_is_parallel: bool = True, reduce_output: bool = True,
                 dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.group, self.input_is_parallel, self.reduce_output = group, input_is_parallel, reduce_output
        self.in_features, self.out_features = in_features, out_features
        local = split_size(in_features, group.size, "RowParallelLinear in_features")
        self.weight = _empty(out_features, local, dtype=dtype, device=device)
        self.bias = _empty(out_features, dtype=dtype, device=device) if bias else None
        self.shard_specs = {"weight": Shard(1, group.rank, group.size)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_tp(x, self.group, dim=-1)
        y = F.linear(x, self.weight)
        if self.reduce_output:
            y = reduce_from_tp(y, self.group)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, tp={self.group.size}, input_is_parallel={self.input_is_parallel}"


class VocabParallelEmbedding(nn.Module):
    """E[ids], with the vocabulary rows split over the TP group.

    Rank i holds rows [i*v, (i+1)*v) with v = ceil(V/p) (the last rank's tail is zero padding when p
    does not divide V). Ids outside a rank's range read zeros there; an all-reduce sums the one
    non-zero contribution per token.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, group: Group, *,
                 dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.group, self.num_embeddings, self.embedding_dim = group, num_embeddings, embedding_dim
        spec = Shard(0, group.rank, group.size, pad=True)
        self.vocab_start, self.vocab_end = spec.local_range(num_embeddings)
        self.weight = _empty(spec.local_size(num_embeddings), embedding_dim, dtype=dtype, device=device)
        self.shard_specs = {"weight": spec}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            return F.embedding(ids, self.weight)
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(out, self.group)

    def extra_repr(self) -> str:
        return f"vocab={self.num_embeddings}, dim={self.embedding_dim}, rows=[{self.vocab_start}, {self.vocab_end})"


class ParallelLMHead(nn.Module):
    """logits = H W^T with the vocabulary (rows of W) split over the TP group, as in
    :class:`VocabParallelEmbedding`.

    ``forward`` all-gathers full logits [..., V] onto every TP rank (padding dropped);
    :meth:`argmax` returns the greedy token without gathering the logits (each rank sends only its
    local max and index).
    """

    def __init__(self, hidden_size: int, vocab_size: int, group: Group, *,
                 dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.group, self.hidden_size, self.vocab_size = group, hidden_size, vocab_size
        spec = Shard(0, group.rank, group.size, pad=True)
        self.vocab_start, self.vocab_end = spec.local_range(vocab_size)
        self.weight = _empty(spec.local_size(vocab_size), hidden_size, dtype=dtype, device=device)
        self.shard_specs = {"weight": spec}

    def local_logits(self, h: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the logits (padding columns included)."""
        return F.linear(h, self.weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        logits = gather_from_tp(self.local_logits(h), self.group, dim=-1)
        return logits[..., : self.vocab_size]

    def argmax(self, h: torch.Tensor) -> torch.Tensor:
        local = self.local_logits(h)
        valid = self.vocab_end - self.vocab_start
        local[..., valid:] = float("-inf")
        value, index = local.max(dim=-1)
        if self.group.size == 1:
            return index
        values = gather_from_tp(value.unsqueeze(-1), self.group, dim=-1)
        indices = gather_from_tp((index + self.vocab_start).unsqueeze(-1), self.group, dim=-1)
        best = values.argmax(dim=-1, keepdim=True)  # ties go to the lowest rank, like torch.argmax
        return indices.gather(-1, best).squeeze(-1)

    def extra_repr(self) -> str:
        return f"hidden={self.hidden_size}, vocab={self.vocab_size}, rows=[{self.vocab_start}, {self.vocab_end})"


__all__ = ["ColumnParallelLinear", "ParallelLMHead", "RowParallelLinear", "VocabParallelEmbedding"]
