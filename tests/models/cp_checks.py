"""Context-parallel checks run on spawned gloo ranks, one world per grid (CP2: 2 ranks; CP2 x TP2:
4 ranks) running every case: each family, each attention method, several chunks, a cached prefix,
a 3-request stream, decode after a CP prefill, and the broken variants that must be caught. Each
check returns numbers keyed by a name; the tests compare them in the pytest process. No
transformers import here."""

from __future__ import annotations

import torch

from vpp.parallel import initialize_model_parallel

METHODS = ("all-gather", "pass-kv", "pass-q")
CHUNK = 16  # 37 tokens: chunks 16, 16, 5 (the last one ragged: not a multiple of 2 cp)


def rel(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


def chunked(stage, ids, request, chunk, start=0, last_only=False):
    outs = [stage(ids[s:s + chunk], request, s, last_token_only=last_only) for s in range(start, len(ids), chunk)]
    return torch.cat(outs)


def family_checks(case, groups, greedy_steps: int) -> dict:
    """One family on this grid: every method with several chunks (all logits and the last token),
    a cached prefix (prefill 20, then the rest), a 3-request stream, KV bytes per rank, and decode."""
    from vpp.models import load_stage
    stage = load_stage(case.path, (0, 4), groups)
    ids, ref = case.prompts["a"], case.logits["a"]
    res = {}
    for method in METHODS:
        stage.cp_method = method
        res[("chunks", method)] = rel(chunked(stage, ids, "a", CHUNK), ref)
        res[("kv_bytes", method)] = stage.cache_nbytes("a")
        res[("kv_rows", method)] = stage._caches()[0].length("a")
        stage.release("a")
        stage(ids[:20], "a", 0)  # a cached prefix of 20 tokens, then the rest
        res[("cached", method)] = rel(stage(ids[20:], "a", 20, last_token_only=True)[0], ref[-1])
        stage.release("a")
        streams = {"a": ids, "b": case.prompts["b"], "c": ids[:23]}  # taking turns chunk by chunk
        outs = {n: [] for n in streams}
        for s in range(0, len(ids), 12):
            for n, p in streams.items():
                if s < len(p):
                    outs[n].append(stage(p[s:s + 12], n, s, last_token_only=True))
        res[("stream", method)] = max(rel(outs["a"][-1][0], ref[-1]), rel(outs["b"][-1][0], case.logits["b"][-1]),
                                      rel(outs["c"][-1][0], ref[22]))
        for n in streams:
            stage.release(n)
    stage.cp_method = "auto"
    tokens = [int(stage(ids, "g", 0, last_token_only=True).argmax())]
    for _ in range(greedy_steps - 1):
        tokens.append(int(stage.decode(torch.tensor(tokens[-1:]), ["g"]).argmax()))
    res[("greedy",)] = tokens
    res[("trace",)] = [t[3] for t in stage.cp_trace]
    stage.release("g")
    return res


def run_cp_checks(rank, world_size, cases, tp, greedy_steps):
    torch.manual_seed(0)
    groups = initialize_model_parallel(tp, context_parallel_size=world_size // tp)
    return {(case.model_type,) + k: v for case in cases for k, v in family_checks(case, groups, greedy_steps).items()}
