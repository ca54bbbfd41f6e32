"""Checks run on two spawned ranks (TP = 2), once per session: every family at ep = 1 (experts
TP-sharded) and ep = 2 (experts spread over the two ranks, both MoE dispatch modes), plus the TP
attention modules. Each check returns a number (a max abs error, or 0/1) keyed by a name; the tests
compare them in the pytest process. No transformers import here."""

from __future__ import annotations

import torch

from vpp.parallel import Group, initialize_model_parallel

CHUNKS = (37, 16, 7, 1)  # whole prompt, ragged last chunks, one token at a time
MOE_LAYOUTS = ((1, "allreduce"), (2, "allreduce"), (2, "alltoall"))
MODEL_TYPES = ("qwen3_moe", "deepseek_v3", "deepseek_v32", "glm_moe_dsa")


def chunks_at_tp2(model_type: str, layout: tuple) -> tuple:
    """The chunk sizes a family runs at TP = 2 with an MoE layout: 37, 16 and 7 on every layout; one token
    at a time (37 calls, the dearest) on one layout per family, rotating, so that each family and each
    layout runs it (TP = 1 runs every chunk size on every family: tests/models/test_parity.py)."""
    i = MODEL_TYPES.index(model_type)
    return CHUNKS if MOE_LAYOUTS.index(layout) == i % len(MOE_LAYOUTS) else CHUNKS[:-1]


def prefill(stage, ids, request, chunk):
    return torch.cat([stage(ids[s:s + chunk], request, s) for s in range(0, len(ids), chunk)])


def interleaved(stage, prompts: dict, chunk: int) -> dict:
    """Prefill every prompt, taking turns chunk by chunk on the same stage."""
    out = {name: [] for name in prompts}
    for s in range(0, max(len(ids) for ids in prompts.values()), chunk):
        for name, ids in prompts.items():
            if s < len(ids):
                out[name].append(stage(ids[s:s + chunk], name, s))
    return {name: torch.cat(parts) for name, parts in out.items()}


def err(a, b) -> float:
    return (a - b).abs().max().item()


def model_checks(cases, groups_by_ep) -> dict:
    from vpp.models import load_stage, stage_starts
    res = {}
    for case in cases:
        ids, ref = case.prompts["a"], case.logits["a"]
        for ep, dispatch in MOE_LAYOUTS:
            key = (case.model_type, ep, dispatch)
            stage = load_stage(case.path, (0, 4), groups_by_ep[ep], moe_dispatch=dispatch)
            for chunk in chunks_at_tp2(case.model_type, (ep, dispatch)):
                res[key + ("chunk", chunk)] = err(prefill(stage, ids, "a", chunk), ref)
                stage.release("a")
            both = interleaved(stage, case.prompts, 5)
            res[key + ("interleaved",)] = max(err(both[n], case.logits[n]) for n in both)
            res[key + ("released",)] = float(stage.requests() == ["a", "b"])
            for name in both:
                stage.release(name)
        # two pipeline stages at TP = 2 (split at the last layer a stage may start at)
        split = stage_starts(case.path)[-1]
        first = load_stage(case.path, (0, split), groups_by_ep[2], moe_dispatch="alltoall")
        last = load_stage(case.path, (split, 4), groups_by_ep[2], moe_dispatch="alltoall")
        h = torch.cat([first(ids[s:s + 7], "a", s) for s in range(0, len(ids), 7)])
        logits = torch.cat([last(h[s:s + 7], "a", s) for s in range(0, len(ids), 7)])
        res[(case.model_type, "pipeline")] = err(logits, ref)
    return res


def attention_checks(tp) -> dict:
    """TP-sharded attention modules against the same module unsharded (built locally on each rank)."""
    from vpp.transformer.attention import Chunk, GQAttention, MLAttention, MLASpec, DSASpec, RopeSpec, RotaryEmbedding
    from vpp.parallel.sharding import load_state
    res = {}
    x = torch.randn(12, 32, generator=torch.Generator().manual_seed(3))
    rope = RotaryEmbedding(RopeSpec(dim=8))
    cos, sin = rope(torch.arange(12), torch.float32)

    def run(module):
        out = torch.cat([module(x[s:s + 5], Chunk("r", s, cos[s:s + 5], sin[s:s + 5])) for s in range(0, 12, 5)])
        module.cache.release("r")
        return out

    def full(name, shape):  # deterministic per name, identical on every rank
        g = torch.Generator().manual_seed(sum(map(ord, name)))
        return torch.ones(shape) if "norm.weight" in name else torch.randn(shape, generator=g) * shape[-1] ** -0.5

    def pair(make):
        ref, sharded = make(Group.single()), make(tp)
        shapes = {n: p.shape for n, p in ref.named_parameters()}
        load_state(ref, lambda n: full(n, shapes[n]))
        load_state(sharded, lambda n: full(n, shapes[n]))
        with torch.inference_mode():
            return err(run(sharded), run(ref))

    for heads, kv in ((4, 2), (4, 1), (2, 2)):  # KV heads split, replicated, one per rank
        res[("gqa", heads, kv)] = pair(lambda g: GQAttention(32, heads, kv, 8, g))
    spec = MLASpec(32, 4, 16, 12, 8, 8, 8, softmax_scale=0.2)
    res[("mla",)] = pair(lambda g: MLAttention(spec, g))
    res[("dsa",)] = pair(lambda g: MLAttention(spec, g, dsa=DSASpec(4, 16, 12)))
    return res


def fp8_checks(cases, groups_by_ep) -> dict:
    """FP8 block-quantized checkpoints (tests/models/fp8_tiny.py) in float32 at TP = 2: the whole model
    with experts TP-sharded (ep = 1) and spread (ep = 2), and two pipeline stages (PP = 2)."""
    from vpp.models import load_stage, stage_starts
    res = {}
    for case in cases:
        ids, ref = case.prompts["a"], case.logits["a"]
        for ep in (1, 2):
            stage = load_stage(case.path, (0, 4), groups_by_ep[ep], dtype=torch.float32)
            res[("fp8", case.model_type, ep)] = err(prefill(stage, ids, "a", 16), ref)
        split = stage_starts(case.path)[-1]
        first, last = (load_stage(case.path, r, groups_by_ep[2], dtype=torch.float32) for r in ((0, split), (split, 4)))
        h = torch.cat([first(ids[s:s + 7], "a", s) for s in range(0, len(ids), 7)])
        logits = torch.cat([last(h[s:s + 7], "a", s) for s in range(0, len(ids), 7)])
        res[("fp8", case.model_type, "pipeline")] = err(logits, ref)
    return res


def run_checks(rank, world_size, cases, fp8_cases=()):
    torch.manual_seed(0)
    groups_by_ep = {ep: initialize_model_parallel(2, expert_model_parallel_size=ep) for ep in (1, 2)}
    res = attention_checks(groups_by_ep[1].tp)
    res.update(model_checks(cases, groups_by_ep))
    res.update(fp8_checks(fp8_cases, groups_by_ep))
    return res
