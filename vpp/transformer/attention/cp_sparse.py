"""DeepSeek Sparse Attention under context parallelism (see :mod:`.context_parallel`).

The indexer's top-k is taken per query over *all* keys: the indexer keys are small (one
``index_head_dim`` row per token, against the latent's ``kv_lora_rank + rope`` and the queries' heads),
so every rank gathers every rank's rows for the chunk, puts them in position order and runs the
same :meth:`~.dsa.Indexer.select` as a single rank on each of its query pieces (so the selection,
ties included, is the single-rank one); the selected positions are global. The sparse attention then
reads the selected latents where they live: the (weight-absorbed) queries and their top-k travel the
ring, each rank attends them over the selected rows it holds (lse -inf where it holds none), and the
partials come back and merge. A decode row's query is on every rank already: each rank attends over
its own selected rows and the partials merge.
"""

from __future__ import annotations

import torch

from vpp.transformer.attention.context_parallel import (
    CPChunk, CPStep, gather_blocks, merge_all, return_partials, ring_pass,
)
from vpp.transformer.attention.kernel import Partial


def gather_index_keys(index_k: torch.Tensor, cp: CPChunk | CPStep) -> torch.Tensor:
    """Every rank's indexer keys [T, d] in position order (this rank's ``index_k`` are its rows)."""
    rows = [len(p) for p in cp.positions]
    blocks = gather_blocks({"k": index_k}, {"k": 0}, None, cp.group, rows)
    full = index_k.new_empty(sum(rows), index_k.shape[1])
    for t, block in enumerate(blocks):
        full[cp.positions[t].to(full.device)] = block["k"]
    return full


def cp_select(indexer, x, q_resid, index_k, cp: CPChunk | CPStep, cos, sin) -> torch.Tensor:
    """Top-k global key positions [m, k] of this rank's queries (its pieces, or a decode row)."""
    full = gather_index_keys(index_k, cp)
    if isinstance(cp, CPStep):
        return indexer.select(x, q_resid, full, full.shape[0] - 1, cos, sin)
    out, row = [], 0
    for piece in cp.split.pieces(cp.group.rank):
        a, b = cp.split.bounds(piece)
        if b > a:
            rows = slice(row, row + b - a)
            out.append(indexer.select(x[rows], q_resid[rows], full, cp.offset + a, cos[rows], sin[rows]))
        row += b - a
    if not out:  # no tokens of this chunk here
        return torch.zeros(0, min(indexer.spec.index_topk, full.shape[0]), dtype=torch.long, device=x.device)
    return torch.cat(out)


def sparse_partial(q: torch.Tensor, topk: torch.Tensor, latent: torch.Tensor, positions: torch.Tensor,
                   total: int, value_dim: int, scale: float) -> Partial:
    """Queries q [m, H, D] (absorbed) over the rows of their top-k (global positions, -1: none) that
    this rank holds (``latent`` [n, D], whose row i is position ``positions[i]``). Returns (out
    [H, m, value_dim] fp32, lse [H, m]); lse -inf where none of a query's rows are here."""
    m, heads, _ = q.shape
    lookup = torch.full((total,), -1, dtype=torch.long, device=q.device)
    lookup[positions.to(q.device)] = torch.arange(len(positions), device=q.device)
    idx = torch.where(topk >= 0, lookup[topk.clamp(min=0)], -1)  # [m, k] local rows
    if latent.shape[0] == 0:
        idx = torch.full_like(idx, -1)
        latent = latent.new_zeros(1, latent.shape[1])
    rows = latent.index_select(0, idx.clamp(min=0).flatten()).view(m, idx.shape[1], latent.shape[1])
    scores = ((q * scale) @ rows.transpose(1, 2)).float()  # [m, H, k]
    scores.masked_fill_((idx < 0)[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = (scores - lse.masked_fill(torch.isinf(lse), 0).unsqueeze(-1)).exp_()
    out = probs @ rows[..., :value_dim].float()  # [m, H, v]
    return out.transpose(0, 1), lse.transpose(0, 1)


def cp_sparse_attention(q: torch.Tensor, topk: torch.Tensor, latent: torch.Tensor, cp: CPChunk,
                        value_dim: int, scale: float) -> torch.Tensor:
    """This rank's queries q [m, H, D] over their top-k rows on every rank (queries travel the ring,
    partials return). Returns [m, H, value_dim] in q's dtype."""
    group, r = cp.group, cp.group.rank
    counts = [cp.split.count(t) for t in range(group.size)]
    partials: dict[int, Partial] = {}

    def visit(src, payload):
        partials[src] = sparse_partial(payload["q"], payload["topk"], latent, cp.positions[r], cp.total,
                                       value_dim, scale)

    ring_pass({"q": q.contiguous(), "topk": topk.contiguous()}, {"q": 0, "topk": 0}, group, counts, visit)
    out, _ = merge_all(return_partials(partials, group, counts))
    return out.transpose(0, 1).to(q.dtype)


__all__ = ["cp_select", "cp_sparse_attention", "gather_index_keys", "sparse_partial"]
