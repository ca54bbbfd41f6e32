"""DCPP on real ranks: profile the real stages of the rank the planner's mode profiles, share the
fitted planner, prefill with the chunk sizes it picks (through the CPP plan, so verifier, executor and
traces apply unchanged).

The engines profile single forwards of one pipeline rank at start-up (see :mod:`vpp.schedules.dcpp`):
vLLM-Ascend the output (last) rank, SGLang the first. :func:`vpp.schedules.dcpp.profiled_rank` decides it,
here and in the simulator alike. Every TP rank of that pipeline rank times its stages (the stages'
collectives need them all); the fit of the lowest global rank among them is then shared with every
rank, so that all derive the same chunk sizes (timings differ slightly between ranks, and different
chunkings would mismatch the plan).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from vpp.parallel.groups import ParallelGroups
from vpp.transformer.attention.context_parallel import Split

from vpp.schedules.dcpp import DEFAULT_VARIANT, DcppPlanner, profiled_rank

from .inputs import is_count
from .stage_contract import check_stages

PROFILE_REQUEST = "vpp-dcpp-profile"


def stage_timer(stage: torch.nn.Module, groups: ParallelGroups, *, seed: int = 0) -> Callable[[int], float]:
    """``measure(tokens) -> seconds``: one forward of ``tokens`` fresh tokens through ``stage``
    (random token ids, or random hidden states for a stage after the first), cache freed after. Under
    context parallelism a chunk of ``tokens`` split over the CP group (this rank's rows; every CP rank
    of the stage times the same sizes, its attention's collectives need them all), so the planner's
    chunks are balanced for the CP stage's cost."""
    gen = torch.Generator().manual_seed(seed)
    cp = groups.cp

    def measure(tokens: int) -> float:
        kw = {}
        if stage.is_first:
            x = torch.randint(0, stage.vocab_size, (tokens,), generator=gen)
        else:
            rows = tokens
            if cp.size > 1:
                rows, kw = Split(tokens, cp.size).count(cp.rank), {"chunk_tokens": tokens}
            x = torch.randn(rows, stage.hidden_size, generator=gen).to(stage.dtype)
        x = x.to(groups.device)  # drawn on the host (the generator is), then moved
        # profiling before the run, not the per-chunk path: synchronize so the host clock times the kernels
        groups.accelerator.synchronize(groups.device)
        start = time.perf_counter()
        with torch.inference_mode():
            stage(x, PROFILE_REQUEST, 0, **kw)
        groups.accelerator.synchronize(groups.device)
        elapsed = time.perf_counter() - start
        stage.release(PROFILE_REQUEST)
        return elapsed

    return measure


def profile_planner(stages: Sequence[torch.nn.Module], groups: ParallelGroups, budget: int, *,
                    variant: str = DEFAULT_VARIANT, **planner_kw) -> DcppPlanner:
    """A :class:`DcppPlanner` fitted on the real stages of the profiled pipeline rank (a collective:
    call it on every rank). ``planner_kw`` go to :class:`DcppPlanner` (``align``, ``merge_tail`` ...)."""
    planner = DcppPlanner(variant, budget=check_budget(budget), **planner_kw)
    check_stages(stages)  # before the profile calls them
    if groups.pp.rank == profiled_rank(variant, groups.pp.size):
        timers = [stage_timer(s, groups) for s in stages]
        planner.profile(lambda n: sum(t(n) for t in timers))
    if dist.is_initialized() and len(groups.members) > 1:
        box: list = [None] * len(groups.members)  # this instance's ranks (the whole world without disaggregation)
        dist.all_gather_object(box, planner if planner.ready else None, group=groups.instance_pg)
        planner = next((p for p in box if p is not None), planner)
    if not planner.ready:
        raise RuntimeError(f"no rank profiled the DCPP planner (mode {variant!r} profiles pipeline rank "
                           f"{profiled_rank(variant, groups.pp.size)} of {groups.pp.size})")
    return planner


def check_budget(budget) -> int:
    """The DCPP token budget: a positive integer, checked before any profiling (the same on every rank)."""
    if not is_count(budget) or budget < 1:
        raise ValueError(f"budget={budget!r} must be a positive integer number of tokens")
    return int(budget)


def forward_dcpp_prefill(stages, input_ids, budget: int, groups: ParallelGroups, *,
                         planner: DcppPlanner | None = None, variant: str = DEFAULT_VARIANT, **kw):
    """Prefill with DCPP chunk sizes over the CPP (loop) layout. Pass a ``planner`` profiled once at
    start-up (:func:`profile_planner`) to avoid profiling on every call; other keywords go to
    :func:`vpp.runtime.api.forward_prefill`."""
    from .api import forward_prefill

    check_budget(budget)
    planner = planner or profile_planner(stages, groups, budget, variant=variant)
    return forward_prefill(stages, input_ids, planner.chunk_sizes, groups, schedule="dcpp", **kw)


__all__ = ["PROFILE_REQUEST", "check_budget", "forward_dcpp_prefill", "profile_planner", "stage_timer"]
