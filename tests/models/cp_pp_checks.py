"""Context parallelism inside the pipeline, checked on one world of 4 gloo ranks (CP2 x PP2): each
case returns numbers keyed by a name, the tests compare them in the pytest process (no transformers
import here).

Per family: the 37-token prompt in chunks of 16, 16 and 5 through CPP (loop: 2 stages of 2 layers),
VPP and VPP-Async (a V: 4 stages of 1 layer, rank 1 holding the fold), the last-token logits'
relative error against transformers on every rank that holds the last stage, and each stage's KV
rows (its CP rank's share only); DCPP with explicit shrinking chunks; greedy decoding over the
sharded caches of the V. GLM-5's layer 2 reuses layer 1's top-k (IndexShare), so no stage may start
there: its loop is cut [1, 3] (layers 1 and 2 in one stage) and its V, whose stages hold one layer
each, runs the same model with an indexer per layer (a case of its own). Then a 3-request stream with a cached prefix (VPP-Async, at most 2 requests
in flight), and the same V with the pipeline's transfers sent to the other CP rank of the next stage
(a deliberately permuted mapping, which the parity check must catch).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from vpp.parallel import initialize_model_parallel
from vpp.parallel.grid import global_rank
from vpp.parallel.groups import Group

CHUNK = 16
SCHEDULES = {"loop": ("cpp",), "v": ("vpp", "vpp-async")}
DCPP_CHUNKS = [(14, 12, 11)]  # a DCPP planner's shape: shrinking chunks of equal time
DCPP_FAMILIES = ("qwen3_moe", "deepseek_v3")
STREAM_FAMILIES = ("qwen3_moe", "deepseek_v32")
CACHED = 12


def rel(a, b) -> float:
    return ((a.float() - b).norm() / b.norm()).item()


def pipeline(case, kind: str, groups, partition=None):
    """This rank's stages of ``case`` on a ``kind`` layout over the pp ranks, in a Pipeline."""
    from vpp.models import load_stage
    from vpp.runtime import Pipeline, make_layout
    layout = make_layout(kind, 4, groups.pp.size, partition=partition)
    stages = [load_stage(case.path, layout.stage_layers[s], groups) for s in layout.stages_of(groups.pp.rank)]
    return Pipeline(stages, groups), 0 in layout.stages_of(groups.pp.rank)


def family_checks(runs: dict, groups, greedy_steps: int) -> dict:
    """``runs``: layout kind -> (case, partition or None)."""
    res = {}
    for kind, schedules in SCHEDULES.items():
        case, partition = runs[kind]
        ids, ref = case.prompts["a"], case.logits["a"]
        pipe, first = pipeline(case, kind, groups, partition)
        calls = [(s, CHUNK) for s in schedules]
        if kind == "loop" and case.model_type in DCPP_FAMILIES:
            calls.append(("dcpp", DCPP_CHUNKS))
        for schedule, chunking in calls:
            out = pipe.prefill(ids if first else None, chunking, schedule=schedule)
            res[("logits", schedule)] = None if out.logits is None else rel(out.logits, ref[-1])
            res[("kv_rows", schedule)] = [st._caches()[0].length(0) for st in pipe.stages]
            pipe.release(0)
        if kind == "v":
            res[("greedy",)] = pipe.generate(ids if first else None, greedy_steps, CHUNK,
                                             schedule="vpp-async").tokens[0]
    return res


def stream_checks(case, groups) -> dict:
    """Three requests (a, b, and a's first 23 tokens), each with a cached prefix of 12 tokens, through
    VPP-Async with at most 2 in flight; the relative error of each request's last-token logits."""
    pipe, first = pipeline(case, "v", groups)
    prompts = [case.prompts["a"], case.prompts["b"], case.prompts["a"][:23]]
    refs = [case.logits["a"][-1], case.logits["b"][-1], case.logits["a"][22]]
    pipe.prefill([p[:CACHED] for p in prompts] if first else None, 8, schedule="vpp-async")
    out = pipe.prefill(prompts if first else None, 8, schedule="vpp-async", cached_tokens=CACHED, concurrency=2)
    errors = None if out.logits is None else max(rel(out.all_logits[q], r) for q, r in enumerate(refs))
    for q in range(len(prompts)):
        pipe.release(q)
    return {("stream",): errors}


def permuted(groups):
    """``groups`` with each pipeline ending at the other CP rank of the next stage: pipeline rank j of
    pipeline c is CP rank (c + j) mod cp (a collective: every rank builds every pipeline's groups)."""
    sizes, mine = groups.sizes, {}
    for c in range(sizes.cp):
        for t in range(sizes.tp):
            members = tuple(global_rank(sizes, tp=t, pp=j, cp=(c + j) % sizes.cp) for j in range(sizes.pp))
            down, up = dist.new_group(list(members)), dist.new_group(list(members))
            if groups.global_rank in members:
                i = members.index(groups.global_rank)
                mine = {"pp": Group(members, i, down), "pp_up": Group(members, i, up)}
    return dataclasses.replace(groups, **mine)


def run_cp_pp_world(rank, world_size, families: dict, greedy_steps: int) -> dict:
    """``families``: model type -> layout kind -> (case, partition)."""
    torch.manual_seed(0)
    groups = initialize_model_parallel(1, 2, context_parallel_size=2)
    res = {}
    for model_type, runs in families.items():
        res.update({(model_type,) + k: v for k, v in family_checks(runs, groups, greedy_steps).items()})
        if model_type in STREAM_FAMILIES:
            res.update({(model_type,) + k: v for k, v in stream_checks(runs["v"][0], groups).items()})
    qwen = families["qwen3_moe"]["v"][0]
    wrong = permuted(groups)
    pipe, first = pipeline(qwen, "v", wrong)
    # 32 tokens in chunks of 8: every CP rank holds 4 rows of each chunk, so the misrouted rows fit the
    # receivers' buffers and only the logits can tell
    out = pipe.prefill(qwen.prompts["a"][:32] if first else None, 8, schedule="vpp-async")
    res[("permuted",)] = None if out.logits is None else rel(out.logits, qwen.logits["a"][31])
    res[("pp_ranks",)] = (groups.pp.rank, wrong.pp.ranks)
    return res
