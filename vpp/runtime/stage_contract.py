"""The stage contract: everything the runtime (executor, :class:`~vpp.runtime.Pipeline`, decode, the
start-up exchange) and the KV hand-over read from a stage module, and nothing more. vpp's models
(:class:`vpp.models.stage.Stage`), the toy model and :class:`vpp.runtime.layer_stages.LayerStage` (a
model author's own layers) all follow it; so may any module of yours.

A stage is a contiguous range of decoder layers, plus the embedding on the stage holding layer 0 and
the final norm and LM head on the stage holding the last layer. Requests are identified by ints (the
prefill calls' ``request_ids``, default 0, 1, ...). Every member, with its meaning, is on
:class:`StageModule`; :data:`REQUIRED` are checked at every entry (the prefill calls and ``Pipeline``)
by :func:`check_stages`, which names every missing member of every stage in one error.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

REQUIRED = ("__call__", "layer_range", "hidden_size", "vocab_size", "is_first", "is_last", "dtype",
            "cache_length", "release")
OPTIONAL = ("max_positions", "reserve", "decode", "nonfinite_layer", "requests", "cache_nbytes")
HANDOVER = ("requests", "export_cache", "import_cache", "cache_slices", "cache_shapes")
CONTEXT_PARALLEL = ("cp_group",)


@runtime_checkable
class StageModule(Protocol):
    """What a stage module offers the runtime. Required (checked at entry):

    * ``stage(x, request, offset, *, last_token_only=False) -> Tensor``: one chunk of one request.
      ``x``: token ids [c] (int64) on the first stage, else hidden states [c, hidden_size]. Returns
      hidden states [c, hidden_size], or on the last stage logits [c, vocab_size] ([1, vocab_size] with
      ``last_token_only``; the executor asks that of the last stage). ``offset``: this request's tokens
      already processed by this stage, which must equal ``cache_length(request)`` (the positions of the
      chunk are ``offset .. offset + c - 1``). Any ``c >= 1``: a decoding step is a chunk of one token.
    * ``layer_range``: ``(start, end)``, the global indices of its layers (``end`` excluded); the runtime
      infers the layout (which rank holds which stage) from these.
    * ``hidden_size``, ``vocab_size`` (ints): the shapes it sends and the logits' width.
    * ``is_first`` (holds the embedding, layer 0), ``is_last`` (holds the norm and head, the last layer).
    * ``dtype``: the ``torch.dtype`` of the hidden states it sends (receivers allocate buffers with it).
    * ``cache_length(request) -> int``: tokens of ``request`` processed so far (0 for an unseen one).
    * ``release(request)``: free every cache of ``request`` (a no-op for an unknown one).

    Optional, used when present:

    * ``max_positions`` (int or None): the longest request the positions cover; prompts (plus tokens
      to decode) past it are refused before any work.
    * ``reserve(request, tokens)``: size the caches once for ``tokens`` in all, before the first chunk.
    * ``decode(x, requests) -> Tensor``: one new position for each of ``requests`` as a batch (else
      the runtime calls the stage once per request, with ``c = 1``).
    * ``nonfinite_layer(request) -> int | None``: the first layer whose output held NaN or Inf, asked
      only after a run that was not finite (to name it in the error).
    * ``cache_nbytes(request=None) -> int``: bytes its caches hold (``vpp prefill`` reports them).
    * KV hand-over (:mod:`vpp.kv`, :data:`HANDOVER`): ``requests()`` (the requests with caches here),
      ``export_cache(request, copy=True)``, ``import_cache(request, tensors, positions=None)``
      (``positions``: under CP, every CP rank's tokens), ``cache_slices()``, ``cache_shapes()``, as
      :class:`vpp.models.stage.Stage` documents them.

    Context parallelism (groups with a CP group of several ranks; :data:`CONTEXT_PARALLEL`): a stage
    offers ``cp_group`` (the :class:`~vpp.parallel.groups.Group` it splits chunks over, checked to be
    the pipeline's) and takes ``chunk_tokens=n`` on every stage but the first: ``x`` is then this CP
    rank's rows of a chunk of ``n`` tokens (the first stage takes the whole chunk's ids and keeps its
    share), and it returns its rows (the last stage: the chunk's logits, ``[1, vocab]`` for the last
    token, on every CP rank).
    """

    layer_range: tuple[int, int]
    hidden_size: int
    vocab_size: int
    is_first: bool
    is_last: bool
    dtype: torch.dtype

    def __call__(self, x: torch.Tensor, request: int, offset: int, *,
                 last_token_only: bool = False) -> torch.Tensor: ...

    def cache_length(self, request: int) -> int: ...

    def release(self, request: int) -> None: ...


def missing_members(stage: object, names: Sequence[str] = REQUIRED) -> list[str]:
    """The members of ``names`` that ``stage`` lacks (``__call__``: not callable)."""
    return [n for n in names if not (callable(stage) if n == "__call__" else hasattr(stage, n))]


def check_stages(stages: Sequence[object], names: Sequence[str] = REQUIRED, what: str = "the stage contract") -> None:
    """Raise one TypeError naming every member of ``names`` missing from any of ``stages`` (by position in
    the list and type), or return."""
    problems = [f"stages[{i}] ({type(s).__name__}) lacks {', '.join(m)}"
                for i, s in enumerate(stages) for m in [missing_members(s, names)] if m]
    if problems:
        raise TypeError(f"{'; '.join(problems)}: {what} (vpp.runtime.stage_contract.StageModule) needs "
                        f"{', '.join(names)}")


def check_context_parallel(stages: Sequence[object], cp_ranks: tuple[int, ...]) -> None:
    """Under context parallelism (``cp_ranks``: the global ranks of this rank's CP group, several),
    every stage must split its chunks over that same group: one TypeError / ValueError naming the
    first stage that cannot."""
    if len(cp_ranks) < 2:
        return
    check_stages(stages, CONTEXT_PARALLEL, "context parallelism")
    for i, s in enumerate(stages):
        have = tuple(getattr(s.cp_group, "ranks", ()))
        if have != tuple(cp_ranks):
            raise ValueError(f"stages[{i}] ({type(s).__name__}) splits its chunks over CP ranks {list(have)}, but "
                             f"the pipeline's CP group is {list(cp_ranks)}: build the stages with the same groups")


__all__ = ["CONTEXT_PARALLEL", "HANDOVER", "OPTIONAL", "REQUIRED", "StageModule", "check_context_parallel", "check_stages", "missing_members"]
