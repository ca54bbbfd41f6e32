"""The public prefill API: ``forward_vpp_prefill`` / ``forward_cpp_prefill`` and friends.

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

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from vpp.parallel.groups import ParallelGroups

from vpp.plan import strategies
from vpp.plan.ir import Plan, Request, chunk_requests
from vpp.plan.layout import Layout, stage_ranks_for
from vpp.plan.trace import Trace
from vpp.plan.verify import verify

from . import handshake
from .executor import ExecutionResult, Executor



@dataclass
class PrefillOutput:
    """``logits``: last-token logits [vocab] of the (first) request on the ranks holding the last stage,
    else None; ``all_logits``: request id -> logits; ``plan``: the plan that ran; ``trace``: the whole
    pipeline's trace (when asked for); ``wall_s``: this rank's time from the start barrier to the end."""

    logits: torch.Tensor | None
    all_logits: dict[int, torch.Tensor]
    plan: Plan
    result: ExecutionResult
    trace: Trace | None
    wall_s: float


def infer_layout(pipeline: Sequence[handshake.RankInfo]) -> Layout:
    """The layout the stage modules describe: stages ordered by first layer, each on the pipeline rank
    that holds it. Raises (with the layer ranges) when they do not tile the model."""
    held = sorted((st.layer_range, rank) for rank, info in enumerate(pipeline) for st in info.stages)
    if not held:
        raise ValueError("no rank holds a stage")
    ranges = tuple(r for r, _ in held)
    ranks = tuple(rank for _, rank in held)
    num_layers = ranges[-1][1]
    P = len(pipeline)
    kind, folds = "custom", len(ranges) // (2 * P) if len(ranges) % (2 * P) == 0 else 1
    for k, f in (("loop", 1), ("v", folds), ("interleaved", folds)):
        try:
            if stage_ranks_for(k, P, f) == ranks:
                kind, folds = k, f
                break
        except ValueError:
            continue
    try:
        return Layout(kind=kind, num_ranks=P, num_layers=num_layers, folds=folds,
                      stage_ranks=ranks, stage_layers=ranges)
    except ValueError as exc:
        by_rank = {r: [list(st.layer_range) for st in info.stages] for r, info in enumerate(pipeline)}
        raise ValueError(f"stage modules do not form a pipeline ({exc}); layer ranges by pipeline rank: "
                         f"{by_rank}") from None


def build_schedule(schedule: str, layout: Layout, requests: Sequence[Request], *,
                   concurrency: int | None = None) -> Plan:
    """The plan of ``schedule``, one of :data:`vpp.plan.strategies.PLANNED` (see that table)."""
    return strategies.get(schedule, strategies.PLANNED).plan(layout, requests, concurrency=concurrency)


def _as_prompts(input_ids) -> list[torch.Tensor] | None:
    if input_ids is None:
        return None
    if isinstance(input_ids, torch.Tensor):
        return [input_ids.reshape(-1) if input_ids.dim() == 2 and input_ids.shape[0] == 1 else input_ids]
    return list(input_ids)


def forward_prefill(
    stages: Sequence[torch.nn.Module],
    input_ids: torch.Tensor | Sequence[torch.Tensor] | None,
    chunk_size: int | Sequence[Sequence[int]] | Callable[[int], Sequence[int]],
    groups: ParallelGroups,
    *,
    schedule: str = "vpp",
    request_ids: Sequence[int] | None = None,
    arrivals: Sequence[float] | None = None,
    concurrency: int | None = None,
    return_trace: bool = False,
    timeout_s: float = 300.0,
    progress=None,
) -> PrefillOutput:
    """Prefill one prompt (a 1-D tensor) or a stream of them (a list) through this rank's ``stages``
    with ``schedule`` (see :func:`build_schedule`). ``chunk_size`` is an int, explicit chunk sizes per
    request, or a function of a prompt's length returning its chunk sizes (a DCPP planner's
    ``chunk_sizes``). A stream may carry ``arrivals`` (seconds after the start; each request enters
    the pipeline no earlier) and a ``concurrency`` limit (at most that many requests in flight). ``progress(n)`` is called on the rank
    holding stage 0 after each chunk it feeds into the pipeline. Every argument problem raises the same error on
    every rank."""
    strategy = strategies.get(schedule, strategies.PLANNED)
    if strategy.chunking == "dcpp" and not callable(chunk_size) and isinstance(chunk_size, int):
        raise ValueError(f"schedule {schedule!r} takes its chunk sizes from a DCPP planner: call "
                         f"forward_dcpp_prefill, or pass planner.chunk_sizes as chunk_size")
    if isinstance(chunk_size, int) and chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    stages = list(stages)
    prompts = _as_prompts(input_ids)
    infos = handshake.exchange(stages, groups, prompts)
    problem = handshake.first_problem(infos)
    if problem:
        raise ValueError(problem)
    pipeline = handshake.pipeline_of(infos, groups)
    layout = infer_layout(pipeline)
    check_stage_shapes(pipeline)
    lengths = handshake.prompt_lengths(infos)
    ids = list(request_ids) if request_ids is not None else list(range(len(lengths)))
    if len(ids) != len(lengths):
        raise ValueError(f"{len(ids)} request ids for {len(lengths)} prompts")
    requests = _requests(lengths, chunk_size, ids, arrivals)
    plan = verify(build_schedule(schedule, layout, requests, concurrency=concurrency))
    mine = {s: m for s, m in zip(layout.stages_of(groups.pp.rank), stages)}
    executor = Executor(plan, mine, groups, pipeline, run_key=infos[0].run_key, timeout_s=timeout_s,
                        progress=progress, timed=return_trace)
    by_id = {q: p for q, p in zip(ids, prompts)} if prompts is not None else {}
    if dist.is_initialized() and groups.sizes.world_size > 1:
        dist.barrier()
    start = time.perf_counter()
    result = executor.run(by_id)
    wall = time.perf_counter() - start
    trace = gather_trace(result, groups, plan) if return_trace else None
    first = result.logits.get(ids[0])
    return PrefillOutput(first, result.logits, plan, result, trace, wall)


def _requests(lengths, chunk_size, ids, arrivals=None) -> list[Request]:
    arrivals = [0.0] * len(lengths) if arrivals is None else [float(a) for a in arrivals]
    if len(arrivals) != len(lengths):
        raise ValueError(f"{len(arrivals)} arrival times for {len(lengths)} prompts")
    if isinstance(chunk_size, int):
        return [Request(q, r.chunk_sizes, a) for q, r, a in zip(ids, chunk_requests(lengths, chunk_size), arrivals)]
    if callable(chunk_size):
        chunk_size = [chunk_size(n) for n in lengths]
    sizes = [tuple(int(c) for c in s) for s in chunk_size]
    if len(sizes) != len(lengths):
        raise ValueError(f"{len(sizes)} chunkings for {len(lengths)} prompts")
    for q, n, s in zip(ids, lengths, sizes):
        if sum(s) != n:
            raise ValueError(f"request {q}: chunk sizes sum to {sum(s)} but the prompt has {n} tokens")
    return [Request(q, s, a) for q, s, a in zip(ids, sizes, arrivals)]


def gather_trace(result: ExecutionResult, groups: ParallelGroups, plan: Plan) -> Trace:
    """The whole pipeline's trace, on every rank of it (an ``all_gather_object`` over the pp group)."""
    spans = list(result.spans)
    if groups.pp.size > 1:
        everyone: list = [None] * groups.pp.size
        dist.all_gather_object(everyone, spans, group=groups.pp.pg)
        spans = [s for part in everyone for s in part]
    meta = dict(result.meta, layout=plan.layout.describe(), requests=[list(q.chunk_sizes) for q in plan.requests],
                arrivals=[[q.id, q.arrival] for q in plan.requests])
    return Trace(groups.pp.size, tuple(spans), meta)


def forward_vpp_prefill(stages, input_ids, chunk_size, groups, *, async_comm: bool = False, **kw) -> PrefillOutput:
    """VPP (Algorithm 1 of the paper) over a V layout; ``async_comm=True`` for VPP-Async."""
    return forward_prefill(stages, input_ids, chunk_size, groups,
                           schedule="vpp-async" if async_comm else "vpp", **kw)


def forward_cpp_prefill(stages, input_ids, chunk_size, groups, **kw) -> PrefillOutput:
    """Plain chunked-prefill pipeline parallelism over a loop layout (one stage per rank)."""
    return forward_prefill(stages, input_ids, chunk_size, groups, schedule="cpp", **kw)


def check_stage_shapes(pipeline: Sequence[handshake.RankInfo]) -> None:
    """All stages of a pipeline must agree on hidden size and dtype (activations flow between them)."""
    seen = {(st.hidden_size, st.dtype) for info in pipeline for st in info.stages}
    if len(seen) > 1:
        detail = {r: [(list(st.layer_range), st.hidden_size, st.dtype) for st in info.stages]
                  for r, info in enumerate(pipeline)}
        raise ValueError(f"stages disagree on (hidden size, dtype): {detail}")
