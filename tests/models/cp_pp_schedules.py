"""The schedules and shapes tests/models/cp_pp_checks.py leaves out, on CP groups as pipeline stages:
VPP-packed (three requests, the next one's first chunks packed into the drain), steps shared by
requests under one token budget, uneven partitions, and a pipeline of 3 ranks (CP2 x PP3, 6 ranks).
Each case returns, per request, the relative error of its last-token logits against transformers
(``None`` on ranks that hold no last stage); the tests compare them in the pytest process (no
transformers import here).

The models have 6 layers (tests/models/test_cp_pipeline_schedules.py saves them), so a V on 2 ranks
(4 stages) can be uneven and a V on 3 ranks has one layer per stage.
"""

from __future__ import annotations

import torch

from vpp.parallel import initialize_model_parallel
from vpp.schedules.shared_budget import shared_budget_stream

LENGTHS = (37, 29, 23)  # prompt a, prompt b, a's first 23 tokens
BUDGET = 16             # the shared token budget of a step (pieces of 3 to 16 tokens)


def rel(a, b) -> float:
    return ((a.float() - b).norm() / b.norm()).item()


def _pipeline(path: str, kind: str, groups, partition):
    from vpp.models import load_stage
    from vpp.runtime import Pipeline, make_layout
    layout = make_layout(kind, 6, groups.pp.size, partition=partition)
    stages = [load_stage(path, layout.stage_layers[s], groups) for s in layout.stages_of(groups.pp.rank)]
    return Pipeline(stages, groups), 0 in layout.stages_of(groups.pp.rank)


def run_case(pipe, first: bool, prompts, refs, schedule: str, chunking, steps=None) -> list | None:
    """Prefill ``prompts`` as one stream; each request's relative error (None off the last stage)."""
    out = pipe.prefill(prompts if first else None, chunking, schedule=schedule, steps=steps)
    errors = None if out.logits is None else [rel(out.all_logits[q], r) for q, r in enumerate(refs)]
    for q in range(len(prompts)):
        pipe.release(q)
    return errors


def run_schedules_world(rank, world_size, paths: dict, prompts: dict, refs: dict, cases: list,
                        permuted_case: tuple | None = None) -> dict:
    """``cases``: (name, model type, layout kind, partition or None, schedule, chunking) where chunking
    is an int (fixed chunks) or "shared" (the shared token-budget steps of :data:`LENGTHS`);
    ``permuted_case``: (model type, layout kind) also run on a deliberately permuted CP mapping
    (``refs[model type][3]``: transformers' logits at the 32nd token)."""
    torch.manual_seed(0)
    groups = initialize_model_parallel(1, world_size // 2, context_parallel_size=2)
    res, pipes = {}, {}
    for name, model_type, kind, partition, schedule, chunking in cases:
        key = (model_type, kind, tuple(partition or ()))
        if key not in pipes:
            pipes[key] = _pipeline(paths[model_type], kind, groups, partition)
        pipe, first = pipes[key]
        steps = None
        if chunking == "shared":
            requests, steps = shared_budget_stream(LENGTHS, BUDGET)
            chunking = [list(q.chunk_sizes) for q in requests]
        res[name] = run_case(pipe, first, prompts[model_type], refs[model_type][:3], schedule, chunking, steps)
        if name == "shared-cpp":
            res["steps"] = steps
    res["pp_rank"] = groups.pp.rank
    if permuted_case is not None:  # each CP rank's rows sent to another CP rank of the next stage
        from tests.models.cp_pp_checks import permuted
        model_type, kind = permuted_case
        wrong = permuted(groups)
        pipe, first = _pipeline(paths[model_type], kind, wrong, None)
        # 32 tokens in chunks of 8: every CP rank holds 4 rows of each chunk, so the misrouted rows fit
        # the receivers' buffers and only the logits can tell
        res["permuted"] = run_case(pipe, first, [prompts[model_type][0][:32]], [refs[model_type][3]], "cpp"
                                   if kind == "loop" else "vpp-async", 8)
        res["permuted_ranks"] = wrong.pp.ranks
    return res
