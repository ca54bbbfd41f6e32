"""The public prefill calls: ``forward_vpp_prefill`` / ``forward_cpp_prefill`` / ``forward_prefill``,
one-shot wrappers over :class:`~.pipeline.Pipeline` (an inference loop that prefills again and again
holds a Pipeline instead: one start-up exchange, cached plans).

A model author calls one of these on every rank with this rank's stage modules (in stage order; see
the stage contract in :mod:`vpp.models.stage`), the prompt token ids on the ranks that hold stage 0
(``None`` elsewhere), a chunk size and the :class:`~vpp.parallel.groups.ParallelGroups`. The layout is
read off the stage modules' layer ranges (checked once, cheaply, on every rank), the plan is built
from it, verified, and executed. The last-token logits come back on the ranks that hold the last
stage; the KV caches stay in the stages, ready for decoding (``stage.release(request)`` frees them).

Example (2 ranks, a V: rank 0 holds layers [0, 2) and [6, 8), rank 1 holds [2, 6))::

    groups = initialize_model_parallel(1, 2)
    stages = [load_stage(path, r, groups) for r in my_layer_ranges]
    out = forward_vpp_prefill(stages, ids if groups.pp.rank == 0 else None, 1024, groups)
    if out.logits is not None:
        next_token = out.logits.argmax()
"""

from __future__ import annotations

from typing import Sequence

import torch

from vpp.parallel.groups import ParallelGroups
from vpp.schedules import strategies

from .inputs import Chunking
from .layout_inference import check_stage_shapes, infer_layout
from .prefill_output import PrefillOutput
from .pipeline import Pipeline
from .traces import gather_trace

__all__ = ["PrefillOutput", "check_stage_shapes", "forward_cpp_prefill", "forward_prefill",
           "forward_vpp_prefill", "gather_trace", "infer_layout"]


def forward_prefill(
    stages: Sequence[torch.nn.Module],
    input_ids,
    chunk_size: Chunking,
    groups: ParallelGroups,
    *,
    schedule: str = "vpp",
    request_ids: Sequence[int] | None = None,
    arrivals: Sequence[float] | None = None,
    concurrency: int | None = None,
    return_trace: bool = False,
    timeout_s: float = 300.0,
    progress=None,
    cached_tokens: int | Sequence[int] = 0,
    steps=None,
) -> PrefillOutput:
    """Prefill one prompt (a 1-D tensor or a list of ints) or a stream of them (a list of those)
    through this rank's ``stages`` with ``schedule`` (one of :data:`vpp.schedules.strategies.PLANNED`). ``chunk_size`` is a
    positive int, explicit chunk sizes per request, or a function of a prompt's length returning its
    chunk sizes (a DCPP planner's ``chunk_sizes``). A stream may carry ``arrivals`` (seconds after the
    start; each request enters the pipeline no earlier) and a ``concurrency`` limit (at most that many
    requests in flight). ``progress(n)`` is called on the rank holding stage 0 after each chunk it
    feeds into the pipeline; a ``progress`` with a ``computed(stage, request, chunk, seconds)`` method
    is also told of every compute on its rank (``vpp prefill`` shows them per rank, with the time left). Every argument problem raises the same error on every rank; every wait
    is bounded by ``timeout_s``. ``cached_tokens=N``: the first N tokens of each prompt are already in
    the stages' caches under its request id (an earlier prefill of them, or ``Pipeline.import_cache``);
    only the rest is chunked and computed (see :meth:`~.pipeline.Pipeline.prefill`). ``steps``: steps
    shared by several prompts (lists of (prompt index, chunk)), see :meth:`~.pipeline.Pipeline.prefill`."""
    strategies.get(schedule, strategies.PLANNED)  # an unknown name fails before any exchange
    pipe = Pipeline(stages, groups, timeout_s=timeout_s)
    return pipe.prefill(input_ids, chunk_size, schedule=schedule, request_ids=request_ids, arrivals=arrivals,
                        concurrency=concurrency, return_trace=return_trace, progress=progress,
                        cached_tokens=cached_tokens, steps=steps)


def forward_vpp_prefill(stages, input_ids, chunk_size, groups, *, async_comm: bool = False, **kw) -> PrefillOutput:
    """VPP (Algorithm 1 of the paper) over a V layout; ``async_comm=True`` for VPP-Async."""
    return forward_prefill(stages, input_ids, chunk_size, groups,
                           schedule="vpp-async" if async_comm else "vpp", **kw)


def forward_cpp_prefill(stages, input_ids, chunk_size, groups, **kw) -> PrefillOutput:
    """Plain chunked-prefill pipeline parallelism over a loop layout (one stage per rank)."""
    return forward_prefill(stages, input_ids, chunk_size, groups, schedule="cpp", **kw)
