"""Multi-head latent attention (DeepSeek-V3), optionally with DeepSeek Sparse Attention (V3.2, GLM-5).

Heads are split over the TP group: q_b_proj (or q_proj), kv_b_proj are column-parallel by head,
o_proj is row-parallel (one all-reduce); the low-rank down-projections, their norms and the DSA
indexer are replicated. Input and output are replicated over TP.

Cache: the *compressed* latent, [tokens, kv_lora_rank + qk_rope_head_dim] per request (the normed
c_kv and the rotated shared rope key), plus the indexer keys under DSA -- 576 numbers per token for
DeepSeek-V3 instead of 128 heads x (192 + 128) for expanded K and V. It is replicated on the TP
ranks (each computes it; sharding it would need an all-gather per chunk).
A dense chunk up-projects the cached latent with kv_b_proj (this rank's heads) and runs the
attention kernel on per-head K/V: O(prefix) extra work per chunk, linear like the attention itself.
It does so in blocks of keys sized by the workspace budget (:mod:`.workspace`): each block of the
prefix is expanded, attended to (no mask: the whole prefix precedes the chunk) and merged into the
running result by its log-sum-exp (:func:`~.kernel.merge_partials`); the chunk's own keys follow in
square causal pieces. So the expanded K/V never exceed one block, whatever the prefix; a chunk whose
keys fit one block runs the plain causal kernel. A sparse DSA chunk (prefix longer than index_topk) never expands: its queries are absorbed
into the latent space (q_nope W_UK) and attend over their gathered top-k latent rows; the output is
up-projected with W_UV -- O(chunk x index_topk).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import nn

from vpp.transformer.attention.cache import RequestCache
from vpp.transformer.attention.context_parallel import CPStep, cp_attention, decode_merge, empty_partial
from vpp.transformer.attention.cp_sparse import cp_select, cp_sparse_attention, sparse_partial
from vpp.transformer.attention.chunk import Batch, Chunk
from vpp.transformer.attention.dsa import DSASpec, Indexer, sparse_latent_attention
from vpp.transformer.attention.kernel import attention_lse, causal_attention, merge_partials
from vpp.transformer.attention.rope import apply_rope, apply_rope_interleaved
from vpp.transformer.attention.workspace import UsesWorkspace, rows_per_block
from vpp.transformer.basic import RMSNorm, linear
from vpp.parallel.groups import Group
from vpp.parallel.layers import ColumnParallelLinear, RowParallelLinear


@dataclass(frozen=True)
class MLASpec:
    hidden_size: int
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    softmax_scale: float  # qk_head_dim^-0.5, times YaRN's mscale^2 where the config asks for it
    rope_interleave: bool = True
    bias: bool = False


class MLAttention(nn.Module, UsesWorkspace):
    """MLA over this rank's heads; with ``dsa`` each query attends to its top-k keys only.
    ``workspace_bytes`` bounds the expanded keys/values of a dense chunk (see the module docstring)."""

    def __init__(self, spec: MLASpec, group: Group, *, dsa: DSASpec | None = None, dtype=None, device=None):
        super().__init__()
        if spec.num_heads % group.size:
            raise ValueError(f"num_attention_heads={spec.num_heads} is not divisible by tp={group.size}")
        if dsa is not None and spec.q_lora_rank is None:
            raise ValueError("DSA needs q_lora_rank (the indexer reads the compressed query)")
        self.spec, self.dsa = spec, dsa
        self.local_heads = spec.num_heads // group.size
        qk_dim = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        kw = dict(dtype=dtype, device=device)
        if spec.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(spec.hidden_size, spec.num_heads * qk_dim, group, **kw)
        else:
            self.q_a_proj = linear(spec.hidden_size, spec.q_lora_rank, bias=spec.bias, **kw)
            self.q_a_layernorm = RMSNorm(spec.q_lora_rank, **kw)
            self.q_b_proj = ColumnParallelLinear(spec.q_lora_rank, spec.num_heads * qk_dim, group, **kw)
        self.kv_a_proj_with_mqa = linear(spec.hidden_size, spec.kv_lora_rank + spec.qk_rope_head_dim,
                                         bias=spec.bias, **kw)
        self.kv_a_layernorm = RMSNorm(spec.kv_lora_rank, **kw)
        self.kv_b_proj = ColumnParallelLinear(
            spec.kv_lora_rank, spec.num_heads * (spec.qk_nope_head_dim + spec.v_head_dim), group, **kw)
        self.o_proj = RowParallelLinear(spec.num_heads * spec.v_head_dim, spec.hidden_size, group,
                                        bias=spec.bias, **kw)
        self.indexer = None
        if dsa is not None and not dsa.shared:
            self.indexer = Indexer(dsa, spec.hidden_size, spec.q_lora_rank, spec.qk_rope_head_dim, **kw)
        self._rope = apply_rope_interleaved if spec.rope_interleave else apply_rope
        layout = {"latent": 0, "index_k": 0} if self.indexer is not None else {"latent": 0}
        shapes = {"latent": (None, spec.kv_lora_rank + spec.qk_rope_head_dim)}
        if self.indexer is not None:
            shapes["index_k"] = (None, dsa.index_head_dim)
        self.cache = RequestCache("MLAttention", layout, shapes=shapes)

    def forward(self, x: torch.Tensor, chunk: Chunk | Batch) -> torch.Tensor:
        s = self.spec
        q_resid = None
        if s.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q_resid = self.q_a_layernorm(self.q_a_proj(x))
            q = self.q_b_proj(q_resid)
        q_nope, q_rope = rearrange(q, "c (h d) -> c h d", h=self.local_heads).split(
            [s.qk_nope_head_dim, s.qk_rope_head_dim], -1)
        q_rope = self._rope(q_rope, chunk.cos, chunk.sin)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([s.kv_lora_rank, s.qk_rope_head_dim], -1)
        k_rope = self._rope(k_rope[:, None, :], chunk.cos, chunk.sin)[:, 0]
        parts = {"latent": torch.cat((self.kv_a_layernorm(latent), k_rope), dim=-1)}
        if self.indexer is not None:
            parts["index_k"] = self.indexer.keys(x, chunk.cos, chunk.sin)
        if isinstance(chunk, Batch):  # a decode step: each row against its own request's cache
            rows = lambda t, i: None if t is None else t[i:i + 1]  # noqa: E731
            out = torch.cat([self._attend(x[i:i + 1], rows(q_resid, i), q_nope[i:i + 1], q_rope[i:i + 1],
                                          {k: v[i:i + 1] for k, v in parts.items()}, row)
                             for i, row in enumerate(chunk.rows)])
        else:
            out = self._attend(x, q_resid, q_nope, q_rope, parts, chunk)
        return self.o_proj(rearrange(out, "c h d -> c (h d)"))

    def _attend(self, x, q_resid, q_nope, q_rope, parts, chunk: Chunk) -> torch.Tensor:
        """Append one request's new latent (and indexer keys) and attend its queries over its cache,
        densely or, past ``index_topk`` keys under DSA, over each query's top-k. Returns [c, heads, v]."""
        if chunk.cp is not None:
            return self._attend_cp(x, q_resid, q_nope, q_rope, parts, chunk)
        cached = self.cache.append(chunk.request, chunk.offset, **parts)
        total = chunk.offset + x.shape[0]
        if self.dsa is None or total <= self.dsa.index_topk:  # every causal key is selected: dense
            if x.shape[0] == 1:  # one query (a decode step): attend in the latent space, no expansion
                return self._absorbed(q_nope, q_rope, cached["latent"])
            return self._dense(q_nope, q_rope, cached["latent"])
        if self.indexer is not None:
            chunk.topk = self.indexer.select(x, q_resid, cached["index_k"], chunk.offset, chunk.cos, chunk.sin)
        elif chunk.topk is None:
            raise RuntimeError("a shared-indexer DSA layer ran before any full-indexer layer of its chunk")
        return self._sparse(q_nope, q_rope, cached["latent"], chunk.topk)

    def _expand(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head K [heads, n, qk] and V [heads, n, v] of ``n`` cached latent rows."""
        s, n = self.spec, latent.shape[0]
        kv = rearrange(self.kv_b_proj(latent[:, : s.kv_lora_rank]), "n (h d) -> n h d", h=self.local_heads)
        k_nope, v = kv.split([s.qk_nope_head_dim, s.v_head_dim], dim=-1)
        k_rope = latent[:, None, s.kv_lora_rank:].expand(n, self.local_heads, s.qk_rope_head_dim)
        return rearrange(torch.cat((k_nope, k_rope), dim=-1), "n h d -> h n d"), rearrange(v, "n h d -> h n d")

    def key_block(self, device: torch.device, dtype: torch.dtype) -> int:
        """Keys expanded at once: the workspace budget over the bytes one expanded key costs (the
        kv_b_proj output, the concatenated key, the value padded to the key width, one copy)."""
        s = self.spec
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        row = self.local_heads * (s.qk_nope_head_dim + s.v_head_dim + 3 * qk) * dtype.itemsize
        return rows_per_block(self.workspace_budget(device), row)

    def _dense(self, q_nope, q_rope, latent) -> torch.Tensor:
        """Attention of the chunk's queries over every cached key, the latent expanded to per-head K/V
        one block of keys at a time (see the module docstring). Returns [c, heads, v]."""
        s, total, c = self.spec, latent.shape[0], q_nope.shape[0]
        q = rearrange(torch.cat((q_nope, q_rope), dim=-1), "c h d -> h c d")
        block = self.key_block(q.device, q.dtype)
        if total <= block:
            k, v = self._expand(latent)
            return causal_attention(q, k, v, s.softmax_scale).transpose(0, 1)
        prefix = total - c
        acc = None  # (out [heads, c, v] fp32, lse [heads, c]) over the keys seen so far
        for start in range(0, prefix, block):  # the prefix: every query sees every key
            k, v = self._expand(latent[start:min(prefix, start + block)])
            acc = _merge_rows(acc, attention_lse(q, k, v, s.softmax_scale), 0)
            del k, v  # before the next block is expanded: one block alive at a time
        for start in range(prefix, total, block):  # the chunk's own keys [start, end)
            end = min(total, start + block)
            k, v = self._expand(latent[start:end])
            first, last = start - prefix, end - prefix  # queries [first, last) see them causally,
            part = attention_lse(q[:, first:last], k, v, s.softmax_scale, causal=True)
            if last < c:  # and queries [last, c) see all of them
                rest = attention_lse(q[:, last:], k, v, s.softmax_scale)
                part = (torch.cat((part[0], rest[0]), 1), torch.cat((part[1], rest[1]), 1))
            acc = _merge_rows(acc, part, first)
            del k, v, part
        return acc[0].to(q.dtype).transpose(0, 1)

    def _absorb(self, q_nope, q_rope):
        """Queries in the latent space (q_nope W_UK, then the rope part) [c, heads, r + rope], and W_UV."""
        s = self.spec
        w = self.kv_b_proj.weight.view(self.local_heads, s.qk_nope_head_dim + s.v_head_dim, s.kv_lora_rank)
        w_uk, w_uv = w[:, : s.qk_nope_head_dim], w[:, s.qk_nope_head_dim:]
        q_latent = (q_nope.transpose(0, 1) @ w_uk).transpose(0, 1)  # [c, heads, kv_lora_rank]
        return torch.cat((q_latent, q_rope), dim=-1), w_uv

    def _absorbed(self, q_nope, q_rope, latent) -> torch.Tensor:
        """Weight-absorbed attention of one query over every cached latent row (a decode step):
        the latent is one key/value head (its first kv_lora_rank columns are the value), so the cost
        is O(keys x (kv_lora_rank + rope)) per head instead of expanding every key to per-head K/V.
        Keys are taken in blocks within the workspace budget and merged by an online softmax (fp32),
        so the workspace does not grow with the prefix. Returns [1, heads, v]."""
        s = self.spec
        q, w_uv = self._absorb(q_nope, q_rope)
        q = q[0].float() * s.softmax_scale  # [heads, r + rope]
        width = latent.shape[1]
        block = rows_per_block(self.workspace_budget(q.device), (self.local_heads + 2 * width) * 4)
        best = total = acc = None
        for start in range(0, latent.shape[0], block):
            keys = latent[start:start + block].float()  # [n, r + rope], one block alive at a time
            scores = q @ keys.t()  # [heads, n]
            top = scores.amax(-1, keepdim=True)
            if best is None:
                best = top
                weights = torch.exp(scores - best)
                total, acc = weights.sum(-1, keepdim=True), weights @ keys[:, : s.kv_lora_rank]
                continue
            new = torch.maximum(best, top)
            old, weights = torch.exp(best - new), torch.exp(scores - new)
            total = total * old + weights.sum(-1, keepdim=True)
            acc = acc * old + weights @ keys[:, : s.kv_lora_rank]
            best = new
        out = (acc / total).to(q_nope.dtype)[:, None, :]  # [heads, 1, r]
        return (out @ w_uv.transpose(1, 2)).transpose(0, 1)

    def _sparse(self, q_nope, q_rope, latent, topk) -> torch.Tensor:
        """Weight-absorbed attention over each query's gathered top-k latent rows. Returns [c, heads, v]."""
        s = self.spec
        q, w_uv = self._absorb(q_nope, q_rope)
        out = sparse_latent_attention(q, latent, topk, s.kv_lora_rank, s.softmax_scale,
                                      budget=self.workspace_budget(q.device))  # [c, heads, r]
        return (out.transpose(0, 1) @ w_uv.transpose(1, 2)).transpose(0, 1)

    def kv_per_q(self) -> float:
        """Bytes of a token's travelling keys (the latent) over its query's (every head): Meta's CP
        rule with the compressed latent in place of K/V heads."""
        s = self.spec
        return (s.kv_lora_rank + s.qk_rope_head_dim) / (s.num_heads * (s.qk_nope_head_dim + s.qk_rope_head_dim))

    def _attend_cp(self, x, q_resid, q_nope, q_rope, parts, chunk: Chunk) -> torch.Tensor:
        """Context parallelism (:mod:`.context_parallel`): this rank caches its own tokens' latent; the
        latent (not expanded heads) is what travels; DSA selects over every rank's indexer keys and
        reads the selected latents where they live (:mod:`.cp_sparse`). Returns [c, heads, v]."""
        s, cp, request = self.spec, chunk.cp, chunk.request
        decode = isinstance(cp, CPStep)
        if not decode or cp.group.rank == cp.owner:
            self.cache.append(request, self.cache.length(request), **parts)
        cached = self.cache.get(request)
        total = sum(len(p) for p in cp.positions)
        if self.dsa is None or total <= self.dsa.index_topk:
            q = torch.cat((q_nope, q_rope), dim=-1).transpose(0, 1)
            expand = lambda rows: dict(zip("kv", self._expand(rows["latent"])))  # noqa: E731
            attend = lambda qs, kv, causal: attention_lse(qs, kv["k"], kv["v"], s.softmax_scale, causal=causal)  # noqa: E731
            if not decode:
                kv = {"latent": cached["latent"]}
                return cp_attention(attend, q, kv, {"latent": 0}, cp, s.v_head_dim, expand).transpose(0, 1)
            part = attend(q, expand(cached), False) if cached else empty_partial(q.shape[0], 1, s.v_head_dim, q)
            return decode_merge(part, cp).to(q.dtype).transpose(0, 1)
        if self.indexer is not None:
            index_k = cached["index_k"] if cached else parts["index_k"][:0]
            chunk.topk = cp_select(self.indexer, x, q_resid, index_k, cp, chunk.cos, chunk.sin)
        elif chunk.topk is None:
            raise RuntimeError("a shared-indexer DSA layer ran before any full-indexer layer of its chunk")
        q, w_uv = self._absorb(q_nope, q_rope)
        latent = cached["latent"] if cached else parts["latent"][:0]
        if decode:
            part = sparse_partial(q, chunk.topk, latent, cp.positions[cp.group.rank], total, s.kv_lora_rank,
                                  s.softmax_scale)
            out = decode_merge(part, cp).to(q.dtype).transpose(0, 1)
        else:
            out = cp_sparse_attention(q, chunk.topk, latent, cp, s.kv_lora_rank, s.softmax_scale)
        return (out.transpose(0, 1) @ w_uv.transpose(1, 2)).transpose(0, 1)


def _merge_rows(acc, part, first: int):
    """Merge ``part`` (queries ``first`` onwards) into ``acc`` (every query), or start ``acc`` (fp32)
    with it when ``first == 0``. Queries before ``first`` keep their running result."""
    if acc is None:
        if first:
            raise AssertionError("the first block of keys must cover every query")
        return part[0].float(), part[1]
    if first == 0:
        return merge_partials(acc, part)
    out, lse = merge_partials((acc[0][:, first:], acc[1][:, first:]), part)
    acc[0][:, first:], acc[1][:, first:] = out, lse
    return acc


__all__ = ["MLASpec", "MLAttention"]
