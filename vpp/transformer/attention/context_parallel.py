"""Context parallelism (CP) for chunked prefill: one chunk's new tokens split over the ranks of a CP
group, attention exact over the whole sequence, the KV cache sharded (each rank keeps the K/V of its
own tokens only, never a full copy).

The split (:class:`Split`): a chunk of ``c`` tokens is cut into ``2 cp`` pieces of ``s = ceil(c / 2cp)``
positions (the last ones shorter or empty where ``c`` is not a multiple of ``2cp``: that is the
padding, carried only inside the transfer buffers; a chunk shorter than ``2cp``, such as a ragged
last one, leaves some ranks without tokens, which then only serve their keys); rank ``i`` takes pieces ``i`` and ``2cp - 1 - i``
(the head-tail split of Megatron, Meta's CP paper and vLLM-Ascend), so every rank does the same
causal work. A rank's rows, in its cache as in its hidden states, are its two pieces in that order,
appended chunk after chunk.

Attention of a rank's queries over one rank's key block (:func:`block_partial`): the block's rows
from earlier chunks precede every query (no mask); a key piece ``j`` is seen in full by query piece
``i > j``, causally when ``i == j``, not at all when ``i < j``. So every piece is a call of the
existing kernels (:func:`~.kernel.attention_lse`, ``causal=False`` or square causal), and pieces
merge by the fp32 log-sum-exp rule (:func:`~.kernel.merge_partials`); a query without keys in a
block contributes ``lse = -inf``. Three ways to bring queries and keys together (``method``):

* ``all-gather``: every rank gathers every rank's block (transient: the cache stays sharded).
* ``pass-kv``: the blocks travel around the ring; the next block's transfer is posted before the
  current block's attention and waited for after it.
* ``pass-q``: the queries travel around the ring; each rank attends the visitors over its own
  block, and the partial outputs and log-sum-exps return to their owners (one all-to-all).

:func:`choose_method` is Meta's rule (arXiv 2411.01783): pass-KV when the new tokens are a large
enough share of the keys (new / (new + cached) >= KV bytes / Q bytes per token, ``2 kv_heads /
q_heads`` for GQA), else pass-Q. DSA's top-k and sparse path are in :mod:`.cp_sparse`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from vpp.parallel.comm import all_to_all, post_exchange
from vpp.parallel.groups import Group
from vpp.transformer.attention.kernel import Partial, merge_partials

METHODS = ("all-gather", "pass-kv", "pass-q")
Attend = Callable[[torch.Tensor, dict, bool], Partial]  # (q [H, m, D], key rows, causal) -> partial


@dataclass(frozen=True)
class Split:
    """How one chunk of ``tokens`` new tokens splits over ``cp`` ranks (see the module docstring)."""

    tokens: int
    cp: int

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.cp < 1:
            raise ValueError(f"cannot split a chunk of {self.tokens} tokens over cp={self.cp} ranks")

    @property
    def piece(self) -> int:
        return -(-self.tokens // (2 * self.cp))

    @property
    def padded(self) -> int:
        """The chunk rounded up to a multiple of 2 cp (what the equal-sized transfer buffers hold)."""
        return self.piece * 2 * self.cp

    def bounds(self, piece: int) -> tuple[int, int]:
        """Chunk-relative token range [start, end) of ``piece`` (empty past the chunk's end)."""
        s = self.piece
        return min(piece * s, self.tokens), min((piece + 1) * s, self.tokens)

    def pieces(self, rank: int) -> tuple[int, int]:
        return rank, 2 * self.cp - 1 - rank

    def count(self, rank: int) -> int:
        return sum(b - a for a, b in map(self.bounds, self.pieces(rank)))

    def index(self, rank: int) -> torch.Tensor:
        """Chunk-relative positions of ``rank``'s tokens, in its row order."""
        return torch.cat([torch.arange(*self.bounds(p)) for p in self.pieces(rank)])

    def owner(self, token: int) -> tuple[int, int]:
        """(rank, row on that rank) of chunk-relative ``token``."""
        piece = token // self.piece
        rank = piece if piece < self.cp else 2 * self.cp - 1 - piece
        first = self.bounds(rank)
        row = token - first[0] if piece == rank else (first[1] - first[0]) + token - self.bounds(piece)[0]
        return rank, row


@dataclass
class CPChunk:
    """What an attention layer needs to know about a chunk under CP: the group, the split, the rows
    each rank held before the chunk (``prefix``), the global positions of each rank's rows with the
    chunk appended (``positions``), and the method chosen for it."""

    group: Group
    split: Split
    offset: int
    prefix: tuple[int, ...]
    positions: tuple[torch.Tensor, ...]
    method: str
    exchange: Callable = post_exchange  # posts a ring step's transfers (the emulated device passes its own)

    def rows(self, rank: int) -> int:
        return self.prefix[rank] + self.split.count(rank)

    @property
    def total(self) -> int:
        return self.offset + self.split.tokens


@dataclass
class CPStep:
    """One decode row under CP: ``owner`` appends the new token's K/V; ``positions`` as in
    :class:`CPChunk`, the new token included."""

    group: Group
    owner: int
    positions: tuple[torch.Tensor, ...]


def choose_method(new: int, cached: int, kv_per_q: float) -> str:
    """Meta's rule: pass-KV when new / (new + cached) >= ``kv_per_q`` (the K/V bytes of a token over
    its query's bytes: ``2 kv_heads / q_heads`` for GQA), else pass-Q."""
    return "pass-kv" if new / (new + cached) >= kv_per_q else "pass-q"


# --- one block: the pieces of a rank's queries over the pieces of a rank's keys -------------------

def _segments(split: Split, rank: int, first_row: int) -> list[tuple[int, int, int]]:
    out, row = [], first_row
    for p in split.pieces(rank):
        a, b = split.bounds(p)
        if b > a:
            out.append((row, row + b - a, p))
        row += b - a
    return out


def block_partial(attend: Attend, q: torch.Tensor, q_rank: int, kv: dict, dims: dict, kv_rank: int,
                  cp: CPChunk, value_dim: int, prepare: Callable[[dict], dict] | None = None) -> Partial:
    """Attention of ``q_rank``'s queries q [H, m, D] over ``kv_rank``'s rows ``kv`` (parts with their
    token dims ``dims``): (out [H, m, value_dim] fp32, lse [H, m]); lse -inf where a query sees none.
    ``prepare`` turns a slice of rows into what ``attend`` takes (MLA: the latent expanded to per-head
    K/V), once per slice: the block's earlier-chunk rows are attended by every query in one call."""
    prepare = prepare or (lambda rows: rows)
    queries = _segments(cp.split, q_rank, 0)
    if not queries:  # a rank without tokens in this chunk
        return empty_partial(q.shape[0], 0, value_dim, q)
    prefix = cp.prefix[kv_rank]
    cut = lambda a, b: prepare({n: t.narrow(dims[n], a, b - a) for n, t in kv.items()})  # noqa: E731
    before = None
    if prefix:  # rows of earlier chunks: seen by every query, no mask
        out, lse = attend(q, cut(0, prefix), False)
        before = (out.float(), lse)
    pieces = [(kp, cut(ka, kb)) for ka, kb, kp in _segments(cp.split, kv_rank, prefix)
              if any(kp <= qp for _, _, qp in queries)]
    outs, lses = [], []
    for qa, qb, qp in queries:
        acc = None if before is None else (before[0][:, qa:qb], before[1][:, qa:qb])
        for kp, rows in pieces:
            if kp > qp:
                continue
            out, lse = attend(q[:, qa:qb], rows, kp == qp)
            acc = (out.float(), lse) if acc is None else merge_partials(acc, (out.float(), lse))
        if acc is None:
            acc = empty_partial(q.shape[0], qb - qa, value_dim, q)
        outs.append(acc[0])
        lses.append(acc[1])
    return torch.cat(outs, 1), torch.cat(lses, 1)


# --- moving blocks: packed into one buffer per transfer ------------------------------------------

def _shapes(kv: dict, dims: dict, rows: int) -> dict:
    return {n: tuple(rows if d == dims[n] else s for d, s in enumerate(t.shape)) for n, t in kv.items()}


def _order(tensors: dict) -> list:
    """Widest elements first, so that every part starts at an offset its dtype can be viewed at."""
    return sorted(tensors, key=lambda n: -tensors[n].element_size())


def _pack(tensors: dict) -> torch.Tensor:
    return torch.cat([tensors[n].contiguous().reshape(-1).view(torch.uint8) for n in _order(tensors)])


def _unpack(buf: torch.Tensor, like: dict, shapes: dict) -> dict:
    out, at = {}, 0
    for n in _order(like):
        t = like[n]
        size = t.element_size()
        for s in shapes[n]:
            size *= s
        out[n] = buf[at:at + size].view(t.dtype).view(shapes[n])
        at += size
    return out


def _nbytes(like: dict, shapes: dict) -> int:
    return len(_pack({n: t.new_empty(shapes[n]) for n, t in like.items()})) if like else 0


def gather_blocks(kv: dict, dims: dict, cp: CPChunk | None, group: Group, rows: list[int]) -> list[dict]:
    """Every rank's rows (``rows[t]`` of them), gathered: transfer buffers padded to the longest."""
    longest = max(rows)
    padded = {}
    for n, t in kv.items():
        pad = list(t.shape)
        pad[dims[n]] = longest - t.shape[dims[n]]
        padded[n] = torch.cat((t, t.new_zeros(pad)), dims[n]) if pad[dims[n]] else t
    buf = _pack(padded)
    parts = [torch.empty_like(buf) for _ in range(group.size)]
    dist.all_gather(parts, buf, group=group.pg)
    shapes = _shapes(kv, dims, longest)
    return [{n: x.narrow(dims[n], 0, rows[t]) for n, x in _unpack(parts[t], kv, shapes).items()}
            for t in range(group.size)]


def ring_pass(payload: dict, dims: dict, group: Group, rows: list[int], visit: Callable[[int, dict], None],
              exchange: Callable = post_exchange) -> None:
    """Pass ``payload`` (this rank's tensors, ``rows[t]`` rows on rank t) around the ring; ``visit(src,
    tensors)`` runs on every rank's payload, its own first. The next transfer is posted before the
    current visit and waited for after it (the transfer overlaps the attention). ``exchange(sends,
    recvs, group)`` posts a step's transfers and returns their works (:func:`~vpp.parallel.comm.post_exchange`;
    on an accelerator ``wait()`` orders the compute stream after the receive, the host does not block)."""
    n, r = group.size, group.rank
    current = payload
    for step in range(n):
        src = (r - step) % n
        works, nxt = [], None
        if step < n - 1:
            shapes = _shapes(payload, dims, rows[(r - step - 1) % n])
            nxt = torch.empty(_nbytes(payload, shapes), dtype=torch.uint8, device=_device(payload))
            sent = _pack(current)  # alive until the send completes; empty transfers are skipped
            works = exchange([(sent, (r + 1) % n)] if sent.numel() else [],
                             [(nxt, (r - 1) % n)] if nxt.numel() else [], group)
        visit(src, current)
        for w in works:
            w.wait()
        if nxt is not None:
            current = _unpack(nxt, payload, shapes)


def _device(tensors: dict) -> torch.device:
    return next(iter(tensors.values())).device


def return_partials(partials: dict[int, Partial], group: Group, counts: list[int]) -> list[Partial]:
    """Send each partial (out [H, m_t, Dv], lse [H, m_t], for rank t's queries) back to rank t;
    returns the partials of this rank's queries from every rank, in rank order (one all-to-all)."""
    r = group.rank
    rows = [torch.cat((o.transpose(0, 1).reshape(o.shape[1], o.shape[0] * o.shape[2]), l.transpose(0, 1)), 1)
            for o, l in (partials[t] for t in range(group.size))]
    heads, dv = partials[r][0].shape[0], partials[r][0].shape[2]
    got = all_to_all(torch.cat(rows), group, counts, [counts[r]] * group.size)
    out = []
    for block in got.split(counts[r]):
        o, l = block.split([heads * dv, heads], 1)
        out.append((o.reshape(-1, heads, dv).transpose(0, 1), l.transpose(0, 1)))
    return out


def merge_all(parts: list[Partial]) -> Partial:
    """The log-sum-exp rule of :func:`~.kernel.merge_partials` over several partials at once (fp32):
    a row whose lse is -inf in some of them (no keys there) takes weight 0 from those."""
    lses = torch.stack([p[1] for p in parts])
    lse = torch.logsumexp(lses, 0)
    weights = (lses - lse).exp_().unsqueeze(-1)
    return (torch.stack([p[0].float() for p in parts]) * weights).sum(0), lse


def cp_attention(attend: Attend, q: torch.Tensor, kv: dict, dims: dict, cp: CPChunk, value_dim: int,
                 prepare: Callable[[dict], dict] | None = None) -> torch.Tensor:
    """Exact attention of this rank's queries q [H, m, D] over every rank's rows (``kv``: this rank's
    cache, the chunk appended) by ``cp.method``. Returns [H, m, value_dim] in q's dtype."""
    group, r = cp.group, cp.group.rank
    rows = [cp.rows(t) for t in range(group.size)]
    if cp.method == "pass-q":
        partials: dict[int, Partial] = {}
        counts = [cp.split.count(t) for t in range(group.size)]

        def visit(src, payload):
            partials[src] = block_partial(attend, payload["q"].transpose(0, 1), src, kv, dims, r, cp, value_dim,
                                          prepare)

        ring_pass({"q": q.transpose(0, 1).contiguous()}, {"q": 0}, group, counts, visit, cp.exchange)
        acc = merge_all(return_partials(partials, group, counts))
    elif cp.method in ("pass-kv", "all-gather"):
        parts: list[Partial] = []
        if cp.method == "pass-kv":
            ring_pass(kv, dims, group, rows,
                      lambda src, block: parts.append(block_partial(attend, q, r, block, dims, src, cp, value_dim,
                                                                    prepare)), cp.exchange)
        else:
            blocks = gather_blocks(kv, dims, cp, group, rows)
            order = [(r - s) % group.size for s in range(group.size)]
            parts = [block_partial(attend, q, r, blocks[t], dims, t, cp, value_dim, prepare) for t in order]
        acc = merge_all(parts)
    else:
        raise ValueError(f"unknown CP attention method {cp.method!r}; choose from {', '.join(METHODS)}")
    return acc[0].to(q.dtype)


def decode_merge(part: Partial, step: CPStep) -> torch.Tensor:
    """A decode row's partial on each rank (its query replicated, each rank over its own rows; lse -inf
    on a rank without rows), gathered and merged. Returns out in fp32."""
    out, lse = part
    buf = torch.cat((out.float().reshape(-1), lse.reshape(-1)))
    parts = [torch.empty_like(buf) for _ in range(step.group.size)]
    dist.all_gather(parts, buf, group=step.group.pg)
    n = out.numel()
    partials = [(p[:n].view(out.shape), p[n:].view(lse.shape)) for p in parts]
    return merge_all(partials)[0]


def empty_partial(heads: int, queries: int, value_dim: int, like: torch.Tensor) -> Partial:
    return (like.new_zeros(heads, queries, value_dim, dtype=torch.float32),
            like.new_full((heads, queries), float("-inf"), dtype=torch.float32))


__all__ = [
    "CPChunk", "CPStep", "METHODS", "Split", "block_partial", "choose_method", "cp_attention", "decode_merge",
    "empty_partial", "gather_blocks", "merge_all", "return_partials", "ring_pass",
]
