"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): the lightning indexer and the sparse kernel.

The indexer scores every key of the prefix for every query of the chunk,

    I[i, t] = sum_h w[i, h] * relu(q_I[i, h] . k_I[t] / sqrt(d_I)),    w = weights_proj(x) / sqrt(H_I)

(a single-head key per token, cached per request like the KV cache) and keeps the ``index_topk``
best causal keys of each query. Cost profile: the indexer is O(chunk x prefix) but light (one
d_I-wide dot product per head, no softmax, no values); attention itself is O(chunk x index_topk):
:func:`sparse_latent_attention` *gathers* each query's selected rows of the MLA latent cache and
attends over those only (weight-absorbed MLA), never a masked dense attention over the prefix. Both
are computed in blocks of queries sized by the workspace budget (:mod:`.workspace`), so the indexer's
[queries, heads, prefix] scores and the gathered rows stay within it; nothing in the loop waits for
the device (the masks are applied unconditionally, not after asking whether any entry is masked).

The indexer is replicated on every TP rank (it is small, and replication needs no all-reduce of a
[chunk, prefix] score matrix); every rank computes the same selection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import nn

from vpp.transformer.attention.rope import apply_rope, apply_rope_interleaved
from vpp.transformer.attention.workspace import UsesWorkspace, default_budget, rows_per_block
from vpp.transformer.basic import linear


@dataclass(frozen=True)
class DSASpec:
    index_topk: int
    index_n_heads: int
    index_head_dim: int
    rope_interleave: bool = False  # the indexer's own RoPE layout (V3.2: half-split, GLM-5: interleaved)
    shared: bool = False  # no indexer of its own: reuse the previous full layer's selection (GLM-5)


class Indexer(nn.Module, UsesWorkspace):
    """The lightning indexer (parameter names as in Hugging Face: wq_b, wk, k_norm, weights_proj).
    ``workspace_bytes`` bounds its per-block scores (None: the device default)."""

    def __init__(self, spec: DSASpec, hidden_size: int, q_lora_rank: int, rope_dim: int, *, dtype=None, device=None):
        super().__init__()
        self.spec, self.rope_dim = spec, rope_dim
        heads, dim = spec.index_n_heads, spec.index_head_dim
        self.wq_b = linear(q_lora_rank, heads * dim, dtype=dtype, device=device)
        self.wk = linear(hidden_size, dim, dtype=dtype, device=device)
        self.k_norm = nn.LayerNorm(dim, eps=1e-6, dtype=dtype, device=device).requires_grad_(False)
        self.weights_proj = linear(hidden_size, heads, dtype=dtype, device=device)
        self._rope = apply_rope_interleaved if spec.rope_interleave else apply_rope

    def _rotate(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        # the rotated dims come first in the indexer (unlike MLA, where they come last)
        r = self.rope_dim
        return torch.cat((self._rope(x[..., :r], cos, sin), x[..., r:]), dim=-1)

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """This chunk's indexer keys [c, d_I], to be cached."""
        return self._rotate(self.k_norm(self.wk(x))[:, None, :], cos, sin)[:, 0]

    def select(self, x, q_resid, keys, offset: int, cos, sin) -> torch.Tensor:
        """Top-k key positions [c, min(k, T)] of each query over ``keys`` [T, d_I] (prefix and chunk);
        -1 marks a slot beyond a query's causal keys (when it has fewer than k)."""
        c, heads, dim = x.shape[0], self.spec.index_n_heads, self.spec.index_head_dim
        q = self._rotate(rearrange(self.wq_b(q_resid), "c (h d) -> c h d", h=heads), cos, sin).float() * dim ** -0.5
        weights = self.weights_proj(x).float() * heads ** -0.5
        keys_t, total = keys.float().t(), keys.shape[0]
        k = min(self.spec.index_topk, total)
        # per query: fp32 scores of every head and key, the head-summed index row, its mask
        block = rows_per_block(self.workspace_budget(x.device), (heads + 2) * total * 4)
        out = []
        for s in range(0, c, block):
            b = min(block, c - s)
            scores = rearrange(q[s:s + b], "b h d -> (b h) d") @ keys_t
            scores = rearrange(scores, "(b h) t -> b h t", h=heads).relu_()
            index = (weights[s:s + b, None, :] @ scores)[:, 0]  # [b, T]
            first_hidden = offset + s + 1  # query s sees keys [0, offset + s]
            if first_hidden < total:
                index.masked_fill_(_future(b, total, first_hidden, x.device), float("-inf"))
            value, idx = index.topk(k, dim=-1)
            out.append(idx.masked_fill_(value == float("-inf"), -1))
        return torch.cat(out)


def _future(rows: int, cols: int, first_hidden: int, device) -> torch.Tensor:
    """[rows, cols] mask of keys after each query (row i hides columns >= first_hidden + i)."""
    return torch.arange(cols, device=device)[None, :] >= torch.arange(first_hidden, first_hidden + rows,
                                                                      device=device)[:, None]


def sparse_latent_attention(q: torch.Tensor, latent: torch.Tensor, topk: torch.Tensor, value_dim: int,
                            scale: float, *, budget: int | None = None) -> torch.Tensor:
    """Attention of each query over its selected rows of an MQA-style latent cache.

    q [c, H, D] (weight-absorbed queries), latent [T, D] (one key row per token; its first
    ``value_dim`` columns are the value), topk [c, k] row indices (-1: none). Returns [c, H, value_dim].
    Cost O(c * k * H * D), independent of T; scratch memory within ``budget`` bytes per block of
    queries (None: the device default).
    """
    c, heads, width = q.shape
    k = topk.shape[1]
    q = q * scale
    budget = default_budget(q.device) if budget is None else budget
    # per query: its gathered rows, fp32 scores and probabilities of every head
    block = rows_per_block(budget, k * (width * q.element_size() + heads * (4 + q.element_size())))
    out = []
    for s in range(0, c, block):
        idx = topk[s:s + block]
        b = idx.shape[0]
        rows = latent.index_select(0, idx.clamp(min=0).flatten()).view(b, k, width)
        scores = q[s:s + b] @ rows.transpose(1, 2)  # [b, H, k]
        scores.masked_fill_((idx < 0)[:, None, :], float("-inf"))  # always: asking first would sync
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out.append(probs @ rows[..., :value_dim])
    return torch.cat(out)


__all__ = ["DSASpec", "Indexer", "sparse_latent_attention"]
