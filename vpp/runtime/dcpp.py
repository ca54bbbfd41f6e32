"""DCPP on real ranks: profile the real first-rank stage, share the fitted planner, prefill with the
chunk sizes it picks (through the CPP plan, so verifier, executor and traces apply unchanged).

The vLLM-Ascend and SGLang planners both profile single forwards of one pipeline rank's stage at start
-up (see :mod:`.dcpp`). Here the rank holding stage 0 (every TP rank of it, since the stage's
collectives need them all) times its stage on fresh tokens; global rank 0's fit is then broadcast so
that every rank derives the same chunk sizes from it (timings differ slightly between ranks, and
different chunkings would mismatch the plan).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from vpp.parallel.groups import ParallelGroups

from vpp.plan.dcpp import DcppPlanner

PROFILE_REQUEST = "vpp-dcpp-profile"


def stage_timer(stage: torch.nn.Module, groups: ParallelGroups, *, seed: int = 0) -> Callable[[int], float]:
    """``measure(tokens) -> seconds``: one forward of ``tokens`` fresh tokens through ``stage``
    (random token ids, or random hidden states for a stage after the first), cache freed after."""
    gen = torch.Generator().manual_seed(seed)

    def measure(tokens: int) -> float:
        if stage.is_first:
            x = torch.randint(0, stage.vocab_size, (tokens,), generator=gen)
        else:
            x = torch.randn(tokens, stage.hidden_size, generator=gen).to(stage.dtype)
        x = x.to(groups.device)  # drawn on the host (the generator is), then moved
        # profiling before the run, not the per-chunk path: synchronize so the host clock times the kernels
        groups.accelerator.synchronize(groups.device)
        start = time.perf_counter()
        with torch.inference_mode():
            stage(x, PROFILE_REQUEST, 0)
        groups.accelerator.synchronize(groups.device)
        elapsed = time.perf_counter() - start
        stage.release(PROFILE_REQUEST)
        return elapsed

    return measure


def profile_planner(stages: Sequence[torch.nn.Module], groups: ParallelGroups, budget: int, *,
                    variant: str = "vllm-ascend", **planner_kw) -> DcppPlanner:
    """A :class:`DcppPlanner` fitted on the real stage 0 (a collective: call it on every rank)."""
    planner = DcppPlanner(variant, budget=budget, **planner_kw)
    first = [s for s in stages if s.is_first]
    if first:
        planner.profile(stage_timer(first[0], groups))
    if dist.is_initialized() and groups.sizes.world_size > 1:
        root = groups.members[0]
        box = [planner if groups.global_rank == root else None]
        dist.broadcast_object_list(box, src=root, group=groups.instance_pg)
        planner = box[0]
    if not planner.ready:
        raise RuntimeError("no rank holding stage 0 profiled the DCPP planner (the instance's first global rank must hold stage 0)")
    return planner


def forward_dcpp_prefill(stages, input_ids, budget: int, groups: ParallelGroups, *,
                         planner: DcppPlanner | None = None, variant: str = "vllm-ascend", **kw):
    """Prefill with DCPP chunk sizes over the CPP (loop) layout. Pass a ``planner`` profiled once at
    start-up (:func:`profile_planner`) to avoid profiling on every call; other keywords go to
    :func:`vpp.schedules.api.forward_prefill`."""
    from .api import forward_prefill

    planner = planner or profile_planner(stages, groups, budget, variant=variant)
    return forward_prefill(stages, input_ids, planner.chunk_sizes, groups, schedule="dcpp", **kw)
