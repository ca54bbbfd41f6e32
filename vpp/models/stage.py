"""A pipeline stage: a contiguous range of decoder layers, plus the embedding on the stage that
holds layer 0 and the final norm and LM head on the stage that holds the last layer.

It follows the stage contract, :class:`vpp.runtime.stage_contract.StageModule` (every member the
runtime reads, with its meaning; checked at entry with one error naming every missing member). Its
call, the part a model author meets first::

    stage(x, request, offset, *, last_token_only=False) -> Tensor

``x`` is a LongTensor [c] of token ids on the first stage, else hidden states [c, hidden]. Returns
hidden states [c, hidden], or logits [c, vocab] on the last stage ([1, vocab] with
``last_token_only``). ``offset`` is the number of this request's tokens already processed and must
equal :meth:`Stage.cache_length`. One request per call, no batch dim, any ``c >= 1`` (a decoding step
is a chunk of one token); several requests may be in flight at once, each with its own caches, until
:meth:`Stage.release` frees them. Optional: ``stage.reserve(request, tokens)`` sizes the request's
caches for ``tokens`` tokens in all before its first chunk (the executor calls it with the prompt
length; a decoder calls it with prompt + new tokens first), so they are allocated once.

Caches live in the attention modules, one :class:`~vpp.transformer.attention.RequestCache` per layer
keyed by request (GQA: post-RoPE K/V; MLA: the compressed latent; DSA adds the indexer keys); the
stage only walks them. Rotary tables are computed once per call and shared by its layers.

Parameter names keep the checkpoint's global layer indices (``model.layers.7.self_attn.q_proj.weight``
on the stage holding layer 7), so they match the Hugging Face checkpoint names.
"""

from __future__ import annotations

from typing import Hashable

import torch
from torch import nn

from vpp.transformer.attention import Batch, Chunk, RotaryEmbedding
from vpp.transformer.basic import RMSNorm, all_finite
from vpp.parallel.groups import ParallelGroups
from vpp.parallel.layers import ParallelLMHead, VocabParallelEmbedding
from vpp.transformer.attention.cache import shape_problem
from vpp.models.cp_state import CPState, from_owner, gather_rows


class Stage(nn.Module):
    def __init__(self, layers: dict[int, nn.Module], *, num_layers: int, hidden_size: int, vocab_size: int,
                 rope: RotaryEmbedding, eps: float, groups: ParallelGroups, dtype: torch.dtype, device=None,
                 config: dict | None = None):
        super().__init__()
        self.config = config or {}  # the model's config.json (with defaults filled in)
        indices = sorted(layers)
        if indices != list(range(indices[0], indices[-1] + 1)):
            raise ValueError(f"a stage holds a contiguous layer range, got layers {indices}")
        self.layer_range = (indices[0], indices[-1] + 1)
        self.is_first, self.is_last = indices[0] == 0, indices[-1] == num_layers - 1
        self.hidden_size, self.vocab_size, self.dtype = hidden_size, vocab_size, dtype
        # the longest prompt the model's positions cover (the pipeline checks prompts against it)
        self.max_positions = self.config.get("max_position_embeddings")
        self.rope = rope
        # context parallelism: each chunk's tokens split over groups.cp (vpp.models.cp_state)
        self.cp_group = groups.cp
        self.cp_method = "auto"  # or one of vpp.transformer.attention.context_parallel.METHODS
        self.cp_trace: list[tuple] = []  # (request, offset, tokens, method) of every CP chunk
        self._cp: dict[Hashable, CPState] = {}
        self._finite: dict[Hashable, torch.Tensor] = {}  # request -> per-layer "output finite" flags
        self.model = nn.Module()
        kw = dict(dtype=dtype, device=device)
        if self.is_first:
            self.model.embed_tokens = VocabParallelEmbedding(vocab_size, hidden_size, groups.tp, **kw)
        self.model.layers = nn.ModuleDict({str(i): layers[i] for i in indices})
        if self.is_last:
            self.model.norm = RMSNorm(hidden_size, eps, **kw)
            self.lm_head = ParallelLMHead(hidden_size, vocab_size, groups.tp, **kw)

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, request: Hashable, offset: int, *,
                last_token_only: bool = False, chunk_tokens: int | None = None) -> torch.Tensor:
        have = self.cache_length(request)
        if offset != have:
            raise ValueError(f"stage {self.layer_range}: request {request!r} chunk at offset {offset}, "
                             f"but this stage has cached {have} of its tokens")
        if self.cp_group.size > 1:
            return self._forward_cp(x, request, offset, last_token_only, chunk_tokens)
        h = self._embed(x)
        positions = torch.arange(offset, offset + h.shape[0], device=h.device)
        cos, sin = self.rope(positions, h.dtype)
        chunk = Chunk(request, offset, cos, sin)
        return self._layers(h, chunk, last_token_only)

    def _layers(self, h: torch.Tensor, chunk: Chunk, last_token_only: bool) -> torch.Tensor:
        request = chunk.request
        finite = []
        for layer in self.model.layers.values():
            h = layer(h, chunk)
            finite.append(all_finite(h))  # device flags, read only after a non-finite run
        flags = torch.stack(finite)
        self._finite[request] = flags if request not in self._finite else self._finite[request] & flags
        if not self.is_last:
            return h
        if last_token_only:
            h = h[-1:]
        return self.lm_head(self.model.norm(h))

    def _forward_cp(self, x, request, offset, last_token_only, chunk_tokens) -> torch.Tensor:
        """Context parallelism: the first stage takes the whole chunk's ids and keeps this rank's
        share (a later stage takes its share of hidden states, ``chunk_tokens`` the chunk's size);
        everything but attention runs on the share. Returns the share's hidden states, or on the last
        stage the chunk's logits in token order ([1, vocab] for the last token, from its owner)."""
        g = self.cp_group
        tokens = len(x) if self.is_first else chunk_tokens
        if tokens is None:
            raise ValueError(f"stage {self.layer_range}: a later stage under CP needs chunk_tokens")
        state = self._cp.setdefault(request, CPState(g.size))
        kv_per_q = next(iter(self.model.layers.values())).self_attn.kv_per_q()
        cp = state.add_chunk(g, offset, tokens, self.cp_method, kv_per_q)
        self.cp_trace.append((request, offset, tokens, cp.method))
        mine = cp.split.index(g.rank)
        for cache in self._caches():  # exact growth past a reservation (never the doubling: a full copy)
            cache.reserve(request, len(cp.positions[g.rank]))
        if self.is_first:
            x = x[mine.to(x.device)]
        elif x.shape[0] != len(mine):
            raise ValueError(f"stage {self.layer_range}: CP rank {g.rank} holds {len(mine)} of the chunk's "
                             f"{tokens} tokens, got {x.shape[0]} rows")
        h = self._embed(x)
        cos, sin = self.rope((offset + mine).to(h.device), h.dtype)
        out = self._layers(h, Chunk(request, offset, cos, sin, cp=cp), False)
        if not self.is_last:
            return out
        if last_token_only:
            owner, row = cp.split.owner(tokens - 1)
            return from_owner(out[row:row + 1], owner, (1, out.shape[1]), out, g)
        return gather_rows(out, cp.split, g)

    @torch.inference_mode()
    def decode(self, x: torch.Tensor, requests: list[Hashable]) -> torch.Tensor:
        """One new position for each of ``requests`` (a decode step): ``x`` is [B] token ids on the
        first stage, else hidden states [B, hidden]; returns [B, hidden] or, on the last stage, the
        next-token logits [B, vocab]. Projections, norms and MLPs (MoE routing included) run on the
        whole batch; attention runs row by row against each request's cache, which grows by one."""
        offsets = [self.cache_length(q) for q in requests]
        missing = [q for q, n in zip(requests, offsets) if n == 0]
        if missing:
            raise ValueError(f"stage {self.layer_range}: requests {missing} have no cached prompt to decode from")
        if len(x) != len(requests):
            raise ValueError(f"stage {self.layer_range}: {len(x)} inputs for {len(requests)} requests")
        h = self._embed(x)
        cos, sin = self.rope(torch.tensor(offsets, device=h.device), h.dtype)
        steps = [self._cp[q].add_token(self.cp_group) if self.cp_group.size > 1 else None for q in requests]
        batch = Batch([Chunk(q, n, cos[i:i + 1], sin[i:i + 1], cp=steps[i])
                       for i, (q, n) in enumerate(zip(requests, offsets))], cos, sin)
        for layer in self.model.layers.values():
            h = layer(h, batch)
        return self.lm_head(self.model.norm(h)) if self.is_last else h

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            if x.dtype != torch.long or x.dim() != 1:
                raise ValueError(f"the first stage takes token ids [c] (int64), got {x.dtype} {tuple(x.shape)}")
            return self.model.embed_tokens(x)
        if x.dim() != 2 or x.shape[1] != self.hidden_size:
            raise ValueError(f"stage {self.layer_range} takes hidden states [c, {self.hidden_size}], "
                             f"got {tuple(x.shape)}")
        return x.to(self.dtype)

    def _caches(self):
        return [layer.self_attn.cache for layer in self.model.layers.values()]

    def cache_length(self, request: Hashable) -> int:
        """Tokens of ``request`` this stage has processed (0 for a request it has not seen); under
        CP every rank's tokens (its cache holds its own share)."""
        if self.cp_group.size > 1:
            state = self._cp.get(request)
            return 0 if state is None else state.tokens
        return self._caches()[0].length(request)

    def requests(self) -> list[Hashable]:
        """Requests with caches on this stage."""
        return self._caches()[0].requests()

    def reserve(self, request: Hashable, tokens: int) -> None:
        """Size every cache of ``request`` on this stage for ``tokens`` tokens in all (prompt, plus
        any tokens to be decoded): allocated once, at the first chunk. Appending past it still works
        (the caches then grow). Never shrinks a reservation. Under CP a rank reserves its share,
        ``ceil(tokens / cp) + 2 cp`` rows (the head-tail split rounds each chunk's share up by at most
        a piece); a chunk that would pass it grows the caches to exactly what it needs."""
        if self.cp_group.size > 1:
            tokens = -(-tokens // self.cp_group.size) + 2 * self.cp_group.size
        for cache in self._caches():
            cache.reserve(request, tokens)

    def cache_nbytes(self, request: Hashable | None = None) -> int:
        """Bytes allocated by this stage's caches for ``request`` (every request: None)."""
        return sum(cache.nbytes(request) for cache in self._caches())

    def nonfinite_layer(self, request: Hashable) -> int | None:
        """The global index of the first layer whose output held NaN or Inf in a chunk of ``request``
        since its caches were allocated, or None (optional in the stage contract: vpp.runtime.finite
        asks it only after a run that was not finite)."""
        flags = self._finite.get(request)
        if flags is None or bool(flags.all()):
            return None
        return self.layer_range[0] + int((~flags).nonzero()[0, 0])

    def release(self, request: Hashable) -> None:
        """Free every cache ``request`` holds on this stage (a no-op for an unknown request)."""
        self._finite.pop(request, None)
        self._cp.pop(request, None)
        for cache in self._caches():
            cache.release(request)

    # --- KV hand-over: a request's caches as plain tensors ---------------------------------------

    def export_cache(self, request: Hashable, *, copy: bool = True, shard: bool = False) -> dict[str, torch.Tensor]:
        """This stage's caches of ``request`` as plain tensors (copies, on this rank's device), named
        ``"model.layers.{i}.self_attn.{part}"`` with the checkpoint's global layer index ``i``:

        * GQA (Qwen3): ``k`` and ``v``, [local KV heads, tokens, head_dim]; ``k`` after q/k-norm and RoPE.
        * MLA (DeepSeek-V3, V3.2, GLM-5): ``latent``, [tokens, kv_lora_rank + qk_rope_head_dim]: the
          normed compressed KV followed by the rotated shared rope key (replicated over TP).
        * DSA: also ``index_k``, [tokens, index_head_dim], the lightning indexer's rotated keys, on the
          layers with an indexer of their own.

        Token ``t`` of a request is row ``t`` (positions 0 .. cache_length - 1). :meth:`import_cache`
        takes the same dict into fresh stages of the same layers and TP rank; :meth:`cache_slices`
        says which slice of the full tensors this rank holds, for a hand-over to another layout.
        ``copy=False`` gives views of the caches instead (valid until the request grows or is freed).
        Under context parallelism the caches are sharded over the CP ranks: ``shard=True`` exports this
        rank's rows, row ``i`` holding token ``cache_positions(request)[i]`` (what a KV hand-over
        gathers from every CP rank, :mod:`vpp.kv.handover`); without it the export is refused."""
        if self.cp_group.size > 1 and not shard:
            raise ValueError(f"stage {self.layer_range}: request {request!r}'s caches are sharded over "
                             f"{self.cp_group.size} CP ranks; export this rank's rows with shard=True (their tokens: "
                             f"cache_positions), or hand them over with vpp.kv.handover.hand_over")
        out = {}
        for i, layer in zip(range(*self.layer_range), self.model.layers.values()):
            for part, tensor in layer.self_attn.cache.get(request).items():
                out[f"model.layers.{i}.self_attn.{part}"] = tensor.clone() if copy else tensor
        return out

    def cache_positions(self, request: Hashable) -> torch.Tensor | None:
        """Under context parallelism, the global positions of this rank's cached rows of ``request``, in
        row order (LongTensor, on the CPU); None without it (row ``t`` holds token ``t``)."""
        if self.cp_group.size == 1:
            return None
        state = self._cp.get(request)
        return torch.zeros(0, dtype=torch.long) if state is None else state.positions[self.cp_group.rank].clone()

    def cache_slices(self) -> dict[str, tuple[int, int, int, int] | None]:
        """Every cache tensor this stage holds per request, named as :meth:`export_cache` names them:
        ``(dim, start, end, full)`` for a slice of the full tensor (GQA: this rank's KV heads along
        dim 0), None for a whole tensor (replicated over TP). What a hand-over to another layout plans
        with (:mod:`vpp.kv.transfer_plan`)."""
        out = {}
        for i, layer in zip(range(*self.layer_range), self.model.layers.values()):
            cache = layer.self_attn.cache
            for part in cache.layouts:
                out[f"model.layers.{i}.self_attn.{part}"] = cache.slices.get(part)
        return out

    def cache_shapes(self) -> dict[str, tuple[tuple[int | None, ...], str]]:
        """Every cache tensor this stage holds per request, named as :meth:`export_cache` names them:
        its shape on this rank with None at the token dim, and its dtype's name (``"bfloat16"``). What a
        hand-over or a load checks the tensors it installs against (another model's are refused)."""
        out = {}
        dtype = str(self.dtype).removeprefix("torch.")
        for i, layer in zip(range(*self.layer_range), self.model.layers.values()):
            cache = layer.self_attn.cache
            for part in cache.layouts:
                out[f"model.layers.{i}.self_attn.{part}"] = (tuple(cache.shapes[part]), dtype)
        return out

    def import_cache(self, request: Hashable, tensors: dict[str, torch.Tensor], *,
                     positions: list[torch.Tensor] | None = None) -> None:
        """Install ``tensors`` (as :meth:`export_cache` names them) as the caches of ``request``,
        which must hold none yet on this stage; decoding then continues as on the exporting stage.
        Into a context-parallel stage ``positions`` gives every CP rank's tokens in row order (the
        same on all of them, as :meth:`cache_positions` reports them afterwards) and ``tensors`` hold
        this rank's rows of them (:mod:`vpp.kv.token_rows` says which)."""
        g = self.cp_group
        if (g.size > 1) != (positions is not None) or (positions is not None and len(positions) != g.size):
            raise ValueError(f"stage {self.layer_range}: importing caches into a stage split over {g.size} CP ranks "
                             f"takes the positions of each CP rank's rows, got "
                             f"{None if positions is None else len(positions)} lists of positions")
        if self.cache_length(request) or request in self.requests():
            raise ValueError(f"stage {self.layer_range}: request {request!r} already has caches here")
        expected = {f"model.layers.{i}.self_attn.{part}" for i, layer in zip(range(*self.layer_range),
                    self.model.layers.values()) for part in layer.self_attn.cache.layouts}
        if set(tensors) != expected:
            missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
            raise ValueError(f"stage {self.layer_range}: KV hand-over for request {request!r} is missing "
                             f"{missing[:4]} and has unexpected {extra[:4]}")
        shapes = self.cache_shapes()
        for name, t in tensors.items():  # another model's caches would decode garbage, or fail later
            problem = shape_problem(name, t.shape, str(t.dtype), *shapes[name])
            if problem:
                raise ValueError(f"stage {self.layer_range}: KV hand-over for request {request!r}: {problem}")
        layers = []
        for i, layer in zip(range(*self.layer_range), self.model.layers.values()):
            cache = layer.self_attn.cache
            parts = {part: tensors[f"model.layers.{i}.self_attn.{part}"] for part in cache.layouts}
            lengths = {t.shape[cache.layouts[part]] for part, t in parts.items()}
            if len(lengths) != 1:
                raise ValueError(f"layer {i}: KV hand-over parts disagree on the token count: {lengths}")
            if positions is not None and lengths != {len(positions[g.rank])}:
                raise ValueError(f"layer {i}: CP rank {g.rank} imports {lengths.pop()} rows, its positions name "
                                 f"{len(positions[g.rank])} tokens")
            layers.append((cache, parts))
        for cache, parts in layers:  # checked first: no layer is left holding the request alone
            cache.append(request, 0, **{part: t.to(self.rope.inv_freq.device) for part, t in parts.items()})
        if positions is not None:
            self._cp[request] = CPState(g.size, sum(len(p) for p in positions), [p.clone().cpu() for p in positions])

    def extra_repr(self) -> str:
        return f"layers=[{self.layer_range[0]}, {self.layer_range[1]}), first={self.is_first}, last={self.is_last}"


__all__ = ["Stage"]
