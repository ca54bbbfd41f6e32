"""Context-parallel checks run on the session's persistent gloo worlds (tests/worlds.py), one per grid
(CP2: 2 ranks; CP2 x TP2: 4 ranks) running every case: each family, each attention method, several chunks, a cached prefix,
a 3-request stream, decode after a CP prefill, and the broken variants that must be caught. Each
check returns numbers keyed by a name; the tests compare them in the pytest process. A broken variant
is installed for one check and restored in a ``finally``, so the world's next case sees the right code.
No transformers import here."""

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
    start = len(stage.cp_trace)
    res[("chunks", "auto")] = rel(chunked(stage, ids, "a", CHUNK), ref)
    res[("auto",)] = [t[3] for t in stage.cp_trace[start:]]
    stage.release("a")
    tokens = [int(stage(ids, "g", 0, last_token_only=True).argmax())]
    for _ in range(greedy_steps - 1):
        tokens.append(int(stage.decode(torch.tensor(tokens[-1:]), ["g"]).argmax()))
    res[("greedy",)] = tokens
    stage.release("g")
    return res


def run_cp_checks(rank, world_size, cases, tp, greedy_steps):
    torch.manual_seed(0)
    groups = initialize_model_parallel(tp, context_parallel_size=world_size // tp)
    return {(case.model_type,) + k: v for case in cases for k, v in family_checks(case, groups, greedy_steps).items()}


def _broken(kind: str):
    """Install a deliberately wrong variant of one CP piece (the parity checks must catch each);
    returns a function that restores the right one."""
    import vpp.transformer.attention.context_parallel as cpmod
    import vpp.transformer.attention.cp_sparse as sparse
    if kind == "split":  # a rank's two pieces in the wrong row order (attention assumes i, then 2cp-1-i)
        good = cpmod.Split.index
        cpmod.Split.index = lambda self, rank: torch.cat([torch.arange(*self.bounds(p))
                                                          for p in reversed(self.pieces(rank))])
        return lambda: setattr(cpmod.Split, "index", good)
    if kind == "merge":  # partials averaged instead of weighted by their log-sum-exps
        good = cpmod.merge_all
        cpmod.merge_all = lambda parts: (torch.stack([p[0].float() for p in parts]).mean(0),
                                         torch.stack([p[1] for p in parts]).amax(0))
        return lambda: setattr(cpmod, "merge_all", good)
    if kind == "topk":  # each rank's top-k over its own indexer keys only
        good = sparse.gather_index_keys

        def local_only(index_k, cp):
            full = index_k.new_zeros(sum(len(p) for p in cp.positions), index_k.shape[1])
            full[cp.positions[cp.group.rank].to(full.device)] = index_k
            return full
        sparse.gather_index_keys = local_only
        return lambda: setattr(sparse, "gather_index_keys", good)
    raise ValueError(kind)


class _LocalRope(torch.nn.Module):
    """RoPE at rank-local positions (offset + 0, 1, ...) instead of the tokens' global ones."""

    def __init__(self, rope):
        super().__init__()
        self.rope, self.inv_freq = rope, rope.inv_freq

    def forward(self, positions, dtype):
        return self.rope(positions.min() + torch.arange(len(positions)), dtype)


def broken_checks(cases) -> dict:
    """The CP2 parity error of each broken variant: split, merge and RoPE on qwen3_moe (pass-KV),
    the DSA top-k on deepseek_v32 (its sparse path)."""
    from vpp.models import load_stage
    groups = initialize_model_parallel(1, context_parallel_size=2)
    res = {}
    for kind, model_type in (("split", "qwen3_moe"), ("merge", "qwen3_moe"), ("rope", "qwen3_moe"),
                             ("topk", "deepseek_v32")):
        case = cases[model_type]
        stage = load_stage(case.path, (0, 4), groups)
        stage.cp_method = "pass-kv"
        restore = None
        if kind == "rope":
            stage.rope = _LocalRope(stage.rope)
        else:
            restore = _broken(kind)
        try:
            res[("broken", kind)] = rel(chunked(stage, case.prompts["a"], "a", CHUNK), case.logits["a"])
        finally:
            if restore:
                restore()
    return res


def run_cp2_world(rank, world_size, cases, greedy_steps, breaks=True):
    """The CP2 world: every family and method, then the broken variants."""
    res = run_cp_checks(rank, world_size, cases, 1, greedy_steps)
    if breaks:
        res.update(broken_checks({c.model_type: c for c in cases}))
    return res
