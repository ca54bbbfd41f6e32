"""Generation with prefill and decode on two instances of one world (prefill/decode disaggregation).

:func:`generate_disaggregated` is :meth:`Pipeline.generate` split in two: the prefill instance's ranks
prefill the prompts with the chosen schedule and sample each request's first token, then every rank
of the world calls :func:`~.handover.hand_over`, which moves the caches to the decode instance
(another layout: typically TP only, so a decode step crosses no pipeline hop) together with the
first tokens and the sampler's state; the decode instance's ranks then decode the rest. The
prefill instance's ranks return the first tokens and the TTFT, the decode instance's ranks the
whole generation.
"""

from __future__ import annotations

import time
from typing import Any, Hashable, Sequence

from vpp.parallel.instances import Disaggregation

from vpp.runtime import inputs
from .handover import hand_over
from vpp.runtime.pipeline import Generation, Pipeline
from vpp.runtime.sampling import Sampler


def generate_disaggregated(pipe: Pipeline, link: Disaggregation, prompts: Any, max_new_tokens: int,
                           chunk_size: inputs.Chunking, *, schedule: str = "vpp", sampler: Sampler | None = None,
                           request_ids: Sequence[Hashable] | None = None, eos_token_id: int | None = None,
                           on_tokens=None) -> Generation:
    """Prefill ``prompts`` on the prefill instance (``prompts`` on the ranks holding stage 0 there, None
    elsewhere), hand the requests over, decode up to ``max_new_tokens`` tokens each on the decode
    instance. Every rank of the world calls it with its own instance's ``pipe``. On decode ranks the
    :class:`Generation` has every token, ``ttft_s`` measured on the prefill instance and
    ``handover_s``; on prefill ranks only the first tokens."""
    if not inputs.is_count(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
    sampler = sampler or Sampler()
    payload, problem, failure = None, None, None
    if link.is_prefill:
        start = time.perf_counter()
        try:
            # decode_room: the decode instance's positions are checked before the prefill (same model)
            out = pipe.prefill(prompts, chunk_size, schedule=schedule, request_ids=request_ids,
                               decode_room=max_new_tokens - 1)
            ids = [q.id for q in out.plan.requests]
        except Exception as exc:  # tell the decode ranks, which would otherwise wait for the hand-over in vain
            failure = exc  # a ValueError or a NonFiniteError is the same on every prefill rank
            problem = str(exc) if isinstance(exc, ValueError) else f"the prefill failed: {type(exc).__name__}: {exc}"
        else:
            tokens = sampler.sample(pipe.next_logits(out, ids))
            generated = {q: [int(t)] for q, t in zip(ids, tokens)}
            payload = dict(ids=ids, generated=generated, ttft_s=time.perf_counter() - start,
                           generator=sampler.generator.get_state())
    try:
        report = hand_over(pipe, link, payload["ids"] if payload else None, payload=payload,
                           reserve=max_new_tokens - 1, problem=problem)
    except BaseException:
        for q in (payload["ids"] if payload else ()):  # a refused hand-over leaves no caches on the prefill ranks
            pipe.release(q)
        if failure is not None and not isinstance(failure, ValueError):
            raise failure from None  # its own type on the prefill ranks (a NonFiniteError names the stage and layer)
        raise
    payload = report.payload
    generated = {q: list(t) for q, t in payload["generated"].items()}
    if link.is_prefill:
        return Generation(generated, payload["ttft_s"], 0.0, 0, report.seconds)
    sampler.generator.set_state(payload["generator"])
    if on_tokens is not None:
        on_tokens(generated)
    try:  # released also when decoding or ``on_tokens`` raises, as Pipeline.generate does
        steps, decode_s = pipe.continue_generation(generated, max_new_tokens, sampler, eos_token_id=eos_token_id,
                                                   on_tokens=on_tokens)
    finally:
        for q in generated:
            pipe.release(q)
    return Generation(generated, payload["ttft_s"], decode_s, steps, report.seconds)


__all__ = ["generate_disaggregated"]
