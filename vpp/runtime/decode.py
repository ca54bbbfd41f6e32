"""One decode step through a pipeline of any layout (loop, V, W, uneven).

A batch of B tokens, one per live request, the same on every rank, goes through the stages in stage
order: the rank holding stage ``s`` takes the batch from stage ``s-1`` (the token ids for stage 0, a
local hand-off when it holds ``s-1`` too, else a receive) and runs::

    stage.decode(x, requests) -> [B, hidden] (or [B, vocab] logits on the last stage)

appending one position to each request's caches (a stage without a ``decode`` method is called once
per request with the stage contract's ``stage(x, request, offset)``). The chain is sequential, so at
most one transfer is in flight and blocking point-to-point cannot deadlock; every wait goes through
the :class:`~.watchdog.Watchdog` (bounded, naming the peer). The last stage's logits are then
broadcast over the pipeline group, so every rank of the pipeline holds them (float32, on the CPU, for
sampling).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from vpp.parallel.comm import irecv, isend

from .finite import FiniteWatch, check_logits
from .watchdog import Watchdog

# "Pipeline" below is :class:`.pipeline.Pipeline`, which imports this module (so this one cannot).


def run_stage_decode(stage: torch.nn.Module, x: torch.Tensor, requests: Sequence[int]) -> torch.Tensor:
    """``stage.decode(x, requests)``, or one stage-contract call per request."""
    if hasattr(stage, "decode"):
        return stage.decode(x, list(requests))
    kw = {"last_token_only": True} if stage.is_last else {}
    return torch.cat([stage(x[i:i + 1], q, stage.cache_length(q), **kw) for i, q in enumerate(requests)])


def _watchdog(pipe: "Pipeline", what: str) -> Watchdog:
    pipe.steps += 1
    groups = pipe.groups
    return Watchdog(f"{pipe.key}/{what}/{pipe.steps}", groups.pp.rank, timeout_s=pipe.timeout_s,
                    pollable=groups.accelerator.backend != "gloo", global_ranks=groups.pp.ranks)


@torch.inference_mode()
def decode_step(pipe: "Pipeline", tokens: torch.Tensor, requests: list[int]) -> torch.Tensor:
    """Next-token logits [B, vocab] (float32, CPU) on every rank; see the module docstring."""
    check_tokens(tokens, requests, pipe.first.vocab_size)
    layout, groups, me = pipe.layout, pipe.groups, pipe.groups.pp.rank
    watchdog = _watchdog(pipe, "decode")
    hidden, dtype = pipe.first.hidden_size, getattr(torch, pipe.first.dtype.replace("torch.", ""))
    logits, h = None, None
    watch = FiniteWatch()
    checked = False
    try:
        check_caches(pipe, requests)  # inside: a rank whose caches differ tells the others at once
        checked = True  # from here a failure may leave a transfer behind (a request unknown everywhere does not)
        for s in range(layout.num_stages):
            if layout.rank_of(s) != me:
                continue
            if s == 0:
                x = tokens.to(groups.device)
            elif layout.rank_of(s - 1) == me:
                x = h
            else:
                x = torch.empty(len(requests), hidden, dtype=dtype, device=groups.device)
                src = layout.rank_of(s - 1)
                watchdog.complete(lambda: irecv(x, src, groups.pp_channel(src, me)), f"decode input of stage {s}", src)
            out = run_stage_decode(pipe.mine[s], x, requests)
            watch.observe(s, None, out)  # read only if the logits turn out non-finite
            if s == layout.last_stage:
                logits = out
            elif layout.rank_of(s + 1) != me:
                dst = layout.rank_of(s + 1)
                watchdog.complete(lambda: isend(out, dst, groups.pp_channel(me, dst)),
                                  f"decode output of stage {s}", dst)
            else:
                h = out
        logits = _broadcast(pipe, logits, len(requests), watchdog)
    except BaseException as exc:
        watchdog.notify_failure(f"pipeline rank {me} (global rank {groups.global_rank}) raised "
                                f"{type(exc).__name__}: {exc} while decoding",
                                groups.global_rank if getattr(exc, "global_rank", None) is None else exc.global_rank)
        if checked:
            pipe.stop(exc, "decode step")
        raise
    finally:
        watchdog.close()
    bad = check_logits(logits, requests)  # the same logits on every rank: every rank agrees here
    if bad:
        found = [(s, bad[0]) for s, _ in watch.local()]
        pipe.check_finite(found or [(layout.last_stage, bad[0])], "decode")
    return logits


def check_tokens(tokens, requests: Sequence[int], vocab_size: int) -> None:
    """One token id per request, in the vocabulary (the same on every rank, so every rank raises alike:
    a negative id would otherwise index the embedding from its end)."""
    if not isinstance(tokens, torch.Tensor):
        raise ValueError(f"decode tokens must be a 1-D tensor of token ids, got {type(tokens).__name__}")
    if tokens.dim() != 1 or tokens.numel() != len(requests) or not requests:
        raise ValueError(f"decode takes one token per request: {tuple(tokens.shape)} tokens for "
                         f"{len(requests)} requests")
    if len(set(requests)) != len(requests):
        raise ValueError(f"decode requests must be distinct, got {requests}")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"decode tokens must be integer token ids, got {tokens.dtype}")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"decode tokens hold ids in [{lo}, {hi}] outside the vocabulary [0, {vocab_size})")


def check_caches(pipe: "Pipeline", requests: Sequence[int]) -> None:
    """Every request must hold a prefilled prefix on this rank's stages (a released or unknown request
    would otherwise start from nothing and decode garbage) with room for one more position."""
    limit = pipe.first.max_positions
    for q in requests:
        for st in pipe.stages:
            have = st.cache_length(q)
            if not have:
                raise ValueError(f"request {q!r} holds no caches on stage {list(st.layer_range)} (global rank "
                                 f"{pipe.groups.global_rank}): prefill it (or load its caches) before decoding; "
                                 f"a released request cannot be decoded")
            if limit is not None and have + 1 > limit:
                raise ValueError(f"request {q!r} holds {have} tokens: one more exceeds the model's {limit} positions")


def broadcast_logits(pipe: "Pipeline", local: torch.Tensor | None, batch: int) -> torch.Tensor:
    """``local`` [B, vocab] from the rank holding the last stage, on every rank of the pipeline."""
    watchdog = _watchdog(pipe, "logits")
    try:
        return _broadcast(pipe, local, batch, watchdog)
    except BaseException as exc:
        pipe.stop(exc, "broadcast of the next-token logits")
        raise
    finally:
        watchdog.close()


def _broadcast(pipe: "Pipeline", local: torch.Tensor | None, batch: int, watchdog: Watchdog) -> torch.Tensor:
    groups, layout = pipe.groups, pipe.layout
    owner = layout.rank_of(layout.last_stage)
    if groups.pp.size == 1:
        return local.float().cpu()
    if groups.pp.rank == owner:
        buf = local.reshape(batch, -1).float().contiguous()
    else:
        buf = torch.empty(batch, pipe.last.vocab_size, dtype=torch.float32, device=groups.device)
    watchdog.complete(lambda: dist.broadcast(buf, src=groups.pp.global_rank(owner), group=groups.pp.pg, async_op=True),
                      "the broadcast of the next-token logits", owner)
    return buf.cpu()


__all__ = ["broadcast_logits", "check_caches", "check_tokens", "decode_step", "run_stage_decode"]
