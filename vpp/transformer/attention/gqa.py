"""Grouped-query attention with per-head q/k RMSNorm and RoPE (Qwen3), sharded by heads over TP."""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from vpp.transformer.attention.cache import RequestCache
from vpp.transformer.attention.chunk import Batch, Chunk
from vpp.transformer.attention.context_parallel import CPStep, cp_attention, decode_merge, empty_partial
from vpp.transformer.attention.kernel import attention_lse, causal_attention
from vpp.transformer.attention.rope import apply_rope
from vpp.transformer.basic import RMSNorm
from vpp.parallel.groups import Group
from vpp.parallel.layers import ColumnParallelLinear, RowParallelLinear
from vpp.parallel.sharding import Shard


def kv_head_shard(num_kv_heads: int, group: Group) -> Shard:
    """Which KV heads a TP rank holds: an equal share when the TP size divides the KV heads; one
    head, replicated on tp / kv consecutive ranks, when the KV heads divide the TP size."""
    tp = group.size
    if num_kv_heads % tp and tp % num_kv_heads:
        raise ValueError(f"tp={tp} is neither a divisor nor a multiple of num_key_value_heads={num_kv_heads}")
    parts = min(num_kv_heads, tp)
    return Shard(0, group.rank * parts // tp, parts)


class KVHeadLinear(nn.Module):
    """Y = X A with A's columns grouped by KV head; this rank holds the heads :func:`kv_head_shard`
    names (no communication: the outputs stay per-rank, as in a column-parallel layer)."""

    def __init__(self, in_features: int, num_kv_heads: int, head_dim: int, group: Group, *,
                 bias: bool = False, dtype=None, device=None):
        super().__init__()
        spec = kv_head_shard(num_kv_heads, group)
        self.local_heads = num_kv_heads // spec.parts
        out = self.local_heads * head_dim
        self.weight = nn.Parameter(torch.empty(out, in_features, dtype=dtype, device=device), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out, dtype=dtype, device=device), requires_grad=False) if bias else None
        self.shard_specs = {"weight": spec, "bias": spec}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


class GQAttention(nn.Module):
    """softmax(q k^T / sqrt(d)) v over heads split across the TP group: rank i holds query heads
    [i H/p, (i+1) H/p) and their KV heads; o_proj (row-parallel) all-reduces the output, so input
    and output are replicated over TP. Caches post-RoPE K and V per request: [kv_heads, tokens, d].
    Parameter names follow Hugging Face (q_proj, k_proj, v_proj, o_proj, q_norm, k_norm)."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, group: Group, *,
                 eps: float = 1e-6, qk_norm: bool = True, bias: bool = False, dtype=None, device=None):
        super().__init__()
        if num_heads % group.size:
            raise ValueError(f"num_attention_heads={num_heads} is not divisible by tp={group.size}")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_key_value_heads={num_kv_heads} does not divide num_attention_heads={num_heads}")
        self.head_dim, self.scale = head_dim, head_dim ** -0.5
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.local_heads = num_heads // group.size
        kw = dict(dtype=dtype, device=device)
        self.q_proj = ColumnParallelLinear(hidden_size, num_heads * head_dim, group, bias=bias, **kw)
        self.k_proj = KVHeadLinear(hidden_size, num_kv_heads, head_dim, group, bias=bias, **kw)
        self.v_proj = KVHeadLinear(hidden_size, num_kv_heads, head_dim, group, bias=bias, **kw)
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, group, bias=bias, **kw)
        self.q_norm = RMSNorm(head_dim, eps, **kw) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps, **kw) if qk_norm else None
        heads = kv_head_shard(num_kv_heads, group).local_range(num_kv_heads)
        shape = (heads[1] - heads[0], None, head_dim)
        self.cache = RequestCache("GQAttention", {"k": 1, "v": 1},
                                  slices={"k": (0, *heads, num_kv_heads), "v": (0, *heads, num_kv_heads)},
                                  shapes={"k": shape, "v": shape})

    def forward(self, x: torch.Tensor, chunk: Chunk | Batch) -> torch.Tensor:
        d = self.head_dim  # explicit heads: c may be 0 under CP
        q = rearrange(self.q_proj(x), "c (h d) -> c h d", h=self.local_heads, d=d)
        k = rearrange(self.k_proj(x), "c (h d) -> c h d", h=self.k_proj.local_heads, d=d)
        v = rearrange(self.v_proj(x), "c (h d) -> c h d", h=self.v_proj.local_heads, d=d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, chunk.cos, chunk.sin), apply_rope(k, chunk.cos, chunk.sin)
        if isinstance(chunk, Batch):  # a decode step: each row against its own request's cache
            out = torch.cat([self._attend(q[i:i + 1], k[i:i + 1], v[i:i + 1], row) for i, row in enumerate(chunk.rows)])
        else:
            out = self._attend(q, k, v, chunk)
        return self.o_proj(rearrange(out, "c h d -> c (h d)"))

    def _attend(self, q, k, v, chunk: Chunk) -> torch.Tensor:
        """Append one request's new K/V and attend its queries over its cache. Returns [c, heads, d]."""
        if chunk.cp is not None:
            return self._attend_cp(q, k, v, chunk)
        kv = self.cache.append(chunk.request, chunk.offset, k=k.transpose(0, 1), v=v.transpose(0, 1))
        return causal_attention(q.transpose(0, 1), kv["k"], kv["v"], self.scale).transpose(0, 1)

    def kv_per_q(self) -> float:
        """K/V bytes of a token over its query's bytes (Meta's CP rule: 2 kv_heads / q_heads)."""
        return 2 * self.num_kv_heads / self.num_heads

    def _attend_cp(self, q, k, v, chunk: Chunk) -> torch.Tensor:
        """Context parallelism: this rank's cache keeps its own tokens' K/V; attention over every
        rank's (:mod:`.context_parallel`). Returns [c, heads, d]."""
        cp, request = chunk.cp, chunk.request
        attend = lambda qs, rows, causal: attention_lse(qs, rows["k"], rows["v"], self.scale, causal=causal)  # noqa: E731
        if isinstance(cp, CPStep):  # a decode row: the owner keeps the new K/V; partials merge
            if cp.group.rank == cp.owner:
                self.cache.append(request, self.cache.length(request), k=k.transpose(0, 1), v=v.transpose(0, 1))
            kv = self.cache.get(request)
            qh = q.transpose(0, 1)
            part = attend(qh, kv, False) if kv else empty_partial(qh.shape[0], 1, self.head_dim, qh)
            return decode_merge(part, cp).to(q.dtype).transpose(0, 1)
        kv = self.cache.append(request, self.cache.length(request), k=k.transpose(0, 1), v=v.transpose(0, 1))
        return cp_attention(attend, q.transpose(0, 1), kv, self.cache.layouts, cp, self.head_dim).transpose(0, 1)


__all__ = ["GQAttention", "KVHeadLinear", "kv_head_shard"]
