"""A model author's own layers as pipeline stages (the stage contract of :mod:`.stage_contract`), with a
per-request KV cache manager the author can use or replace.

Give a list of decoder blocks with the embedding, final norm and head (:func:`stages_from_layers`), or
a module holding them as attributes (:func:`stages_from_module`), and a layout (the split spec:
:func:`vpp.schedules.make_layout`, ``partition=[...]`` for uneven stages)::

    layout = make_layout("v", len(model.layers), groups.pp.size)       # 2 stages per rank, folded
    stages = stages_from_module(model, layout, groups.pp.rank)          # model.embed/layers/norm/head
    out = forward_vpp_prefill(stages, ids if rank_holds_stage0 else None, 512, groups, async_comm=True)

A block is called as ``block(h, positions, kv)``: ``h`` the hidden states of one chunk [c, hidden],
``positions`` its absolute positions [c] (int64, ``offset .. offset + c - 1``: for RoPE and the causal
mask), ``kv`` the block's cache of this request, ``k_all, v_all = kv.update(k, v)`` (the chunk's keys and
values appended along the token dim, every token so far returned), as in Hugging Face's
``past_key_values.update``. The stage checks each chunk's offset against what it holds, that every
block appended the chunk exactly once, and frees a request's caches on ``release``. Stages keep the
blocks' global indices (``layers.7.`` on the stage holding block 7). Tensor parallelism is the
blocks' own business (vpp's models use :mod:`vpp.parallel.layers`); these stages run at TP 1 as given.

:class:`KVCache` grows by concatenation (simple; a copy per chunk). To manage memory otherwise (a
preallocated or paged cache), pass ``cache=YourFactory``: ``YourFactory(num_blocks)`` returns an object
with the methods of :class:`KVCache` (``length``, ``layer``, ``advance``, ``release``, ``requests``,
``nbytes``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn


class LayerKV:
    """One block's cache of one request: :meth:`update` appends a chunk and returns every token so far."""

    def __init__(self, store: list, index: int, dim: int):
        self.store, self.index, self.dim = store, index, dim

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        old = self.store[self.index]
        if old is not None:
            k, v = torch.cat([old[0], k], self.dim), torch.cat([old[1], v], self.dim)
        self.store[self.index] = (k, v)
        return k, v


class KVCache:
    """Per-request keys and values of a stage's ``num_blocks`` blocks, token dim ``dim`` (default -2:
    [heads, tokens, head_dim]). ``length`` counts the tokens every block has appended (``advance``
    moves it after a chunk went through all of them, checking each block appended exactly that)."""

    def __init__(self, num_blocks: int, dim: int = -2):
        self.num_blocks, self.dim = num_blocks, dim
        self._kv: dict[int, list] = {}
        self._length: dict[int, int] = {}

    def length(self, request: int) -> int:
        return self._length.get(request, 0)

    def layer(self, request: int, index: int) -> LayerKV:
        return LayerKV(self._kv.setdefault(request, [None] * self.num_blocks), index, self.dim)

    def advance(self, request: int, tokens: int) -> None:
        want = self.length(request) + tokens
        got = [0 if kv is None else kv[0].shape[self.dim] for kv in self._kv.get(request, [None] * self.num_blocks)]
        wrong = [(i, n) for i, n in enumerate(got) if n != want]
        if wrong:
            raise ValueError(f"request {request!r}: after a chunk of {tokens} tokens every block should hold {want}, "
                             f"but (block, tokens) {wrong} (does each block call kv.update once per chunk?)")
        self._length[request] = want

    def release(self, request: int) -> None:
        self._kv.pop(request, None)
        self._length.pop(request, None)

    def requests(self) -> list[int]:
        return list(self._length)

    def nbytes(self, request: int | None = None) -> int:
        keys = self._kv if request is None else [request] if request in self._kv else []
        return sum(t.nbytes for q in keys for kv in self._kv[q] if kv is not None for t in kv)


class LayerStage(nn.Module):
    """Blocks ``layer_range`` (global indices) of a ``num_layers``-block model, with ``embed`` on the
    first stage and ``norm`` (optional) and ``head`` on the last: a stage of the stage contract."""

    def __init__(self, blocks: Sequence[nn.Module], layer_range: tuple[int, int], num_layers: int, *,
                 embed: nn.Module | None, norm: nn.Module | None, head: nn.Module | None, hidden_size: int,
                 vocab_size: int, dtype: torch.dtype | None = None, max_positions: int | None = None,
                 cache: Callable[[int], Any] = KVCache):
        super().__init__()
        start, end = layer_range
        if not 0 <= start < end <= num_layers or len(blocks) != end - start:
            raise ValueError(f"a stage of blocks [{start}, {end}) of a {num_layers}-block model needs {end - start} "
                             f"blocks, got {len(blocks)}")
        self.layer_range, self.is_first, self.is_last = (start, end), start == 0, end == num_layers
        if (self.is_first and embed is None) or (self.is_last and head is None):
            raise ValueError(f"stage [{start}, {end}) holds the {'first' if self.is_first else 'last'} block: "
                             f"it needs {'embed' if self.is_first and embed is None else 'head'}")
        self.hidden_size, self.vocab_size, self.max_positions = hidden_size, vocab_size, max_positions
        self.layers = nn.ModuleDict({str(start + i): b for i, b in enumerate(blocks)})
        self.embed = embed if self.is_first else None
        self.norm, self.head = (norm, head) if self.is_last else (None, None)
        self.dtype = dtype or next(self.parameters()).dtype
        self.cache = cache(len(blocks))

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, request: int, offset: int, *, last_token_only: bool = False) -> torch.Tensor:
        have = self.cache.length(request)
        if offset != have:
            raise ValueError(f"stage {self.layer_range}: request {request!r} chunk at offset {offset}, "
                             f"but this stage has cached {have} of its tokens")
        h = self.embed(x) if self.is_first else x.to(self.dtype)
        positions = torch.arange(offset, offset + h.shape[0], device=h.device)
        for i, block in enumerate(self.layers.values()):
            h = block(h, positions, self.cache.layer(request, i))
        self.cache.advance(request, h.shape[0])
        if not self.is_last:
            return h
        h = h[-1:] if last_token_only else h
        return self.head(self.norm(h) if self.norm is not None else h)

    def cache_length(self, request: int) -> int:
        return self.cache.length(request)

    def release(self, request: int) -> None:
        self.cache.release(request)

    def requests(self) -> list[int]:
        return self.cache.requests()

    def cache_nbytes(self, request: int | None = None) -> int:
        return self.cache.nbytes(request)

    def extra_repr(self) -> str:
        return f"layers=[{self.layer_range[0]}, {self.layer_range[1]}), first={self.is_first}, last={self.is_last}"


def stages_from_layers(blocks: Sequence[nn.Module], layout, rank: int, *, embed: nn.Module, head: nn.Module,
                       norm: nn.Module | None = None, hidden_size: int | None = None, vocab_size: int | None = None,
                       **kw) -> list[LayerStage]:
    """Pipeline rank ``rank``'s stages of ``layout`` (in stage order) over ``blocks``. ``hidden_size``
    and ``vocab_size`` default to the embedding's ``weight`` shape [vocab, hidden]; ``kw``: ``dtype``,
    ``max_positions``, ``cache`` (see :class:`LayerStage`)."""
    if len(blocks) != layout.num_layers:
        raise ValueError(f"the layout splits {layout.num_layers} blocks, the model has {len(blocks)}")
    if hidden_size is None or vocab_size is None:
        vocab, hidden = embed.weight.shape
        hidden_size, vocab_size = hidden_size or int(hidden), vocab_size or int(vocab)
    return [LayerStage([blocks[i] for i in range(*layout.stage_layers[s])], layout.stage_layers[s], layout.num_layers,
                       embed=embed, norm=norm, head=head, hidden_size=hidden_size, vocab_size=vocab_size, **kw)
            for s in layout.stages_of(rank)]


def stages_from_module(module: nn.Module, layout, rank: int, *, layers: str = "layers", embed: str = "embed",
                       norm: str | None = "norm", head: str = "head", **kw) -> list[LayerStage]:
    """:func:`stages_from_layers` over ``module``'s attributes named ``layers``, ``embed``, ``norm``
    (None: no final norm) and ``head``."""
    names = [n for n in (layers, embed, norm, head) if n is not None]
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        raise ValueError(f"{type(module).__name__} has no attribute(s) {', '.join(missing)} (pass layers=, embed=, "
                         f"norm=, head= with its names)")
    return stages_from_layers(list(getattr(module, layers)), layout, rank, embed=getattr(module, embed),
                              head=getattr(module, head), norm=getattr(module, norm) if norm else None, **kw)


__all__ = ["KVCache", "LayerKV", "LayerStage", "stages_from_layers", "stages_from_module"]
