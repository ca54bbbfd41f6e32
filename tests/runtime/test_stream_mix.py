"""Streams of prompts of mixed lengths (one token, shorter than a chunk, ragged) on three gloo ranks, in
every schedule and the combinations the other stream tests leave out: arrivals out of list order with
request ids of the caller's, shared steps (several requests' pieces in one step, one of them a single
token) with a concurrency limit and arrivals, shared steps over cached prefixes, and one Pipeline
serving a stream, another stream and a generation. Each request's last-token logits equal transformers'
forward of that prompt alone (a request that attended to another's KV would move them by >= 1e-2);
greedy tokens equal transformers' greedy loop; after ``release`` no stage holds a cache entry.

Tolerance as in test_family_matrix.py: fp32, another summation order in attention and the MoE,
~1e-6 on logits of size ~1-5; ``atol=rtol=1e-4``. Cost: one spawned run of 3 ranks, ~15 s on 1 core.
"""

import pytest
import torch

from vpp.models.registry import open_model
from vpp.parallel import initialize_model_parallel
from vpp.schedules import make_layout
from vpp.schedules.shared_budget import shared_budget_stream
from vpp.runtime.api import forward_prefill
from vpp.runtime.pipeline import Pipeline

TOL = dict(atol=1e-4, rtol=1e-4)
LAYERS, PP, CHUNK = 6, 3, 8
LENGTHS = [19, 1, 5, 13]  # ragged, a single token, shorter than a chunk
LATER = [7, 22, 2]  # the second stream of the Pipeline, then generated from
CACHED = [9, 0, 4, 12]  # prefixes prefilled first; request 1 has none
NEW_TOKENS = 3


def _prompts(vocab, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


def _sizes(requests):
    return [list(q.chunk_sizes) for q in requests]


def _cases():
    """(name, schedule, layout kind, keyword arguments, cached prefixes or None)."""
    mixed, mixed_steps = shared_budget_stream(LENGTHS, 16)  # step 1: r0's tail, r1, r2, r3's head
    gated, gated_steps = shared_budget_stream(LENGTHS, 6, concurrency=2)
    rest, rest_steps = shared_budget_stream([n - c for n, c in zip(LENGTHS, CACHED)], 6)
    late_first = dict(arrivals=[0.04, 0.0, 0.02, 0.0], request_ids=[7, 3, 100, 5])
    return [
        ("cpp arrivals out of order, ids, concurrency 2", "cpp", "loop", dict(late_first, concurrency=2), None),
        ("dcpp shrinking chunks", "dcpp", "loop", dict(chunk=[[7, 5, 3, 2, 2], [1], [5], [7, 5, 1]]), None),
        ("vpp-async concurrency 1, arrivals", "vpp-async", "v", dict(concurrency=1, arrivals=[0.0, 0.01, 0.0, 0.02]),
         None),
        ("vpp-packed arrivals out of order, ids", "vpp-packed", "v", late_first, None),
        ("vpp shared steps", "vpp", "v", dict(chunk=_sizes(mixed), steps=mixed_steps), None),
        ("cpp shared steps, concurrency 2, arrivals", "cpp", "loop",
         dict(chunk=_sizes(gated), steps=gated_steps, concurrency=2, arrivals=[0.0, 0.02, 0.0, 0.03]), None),
        ("vpp-packed shared steps, concurrency 2", "vpp-packed", "v",
         dict(chunk=_sizes(gated), steps=gated_steps, concurrency=2), None),
        ("vpp-packed cached prefixes", "vpp-packed", "v", dict(), CACHED),
        ("vpp-async shared steps over cached prefixes", "vpp-async", "v",
         dict(chunk=_sizes(rest), steps=rest_steps), CACHED),
    ]


def _held(stages):
    """Cache entries (and per-request finiteness flags) the stages hold, over every request."""
    return sum(len(st.requests()) + len(st._finite) for st in stages) + sum(st.cache_nbytes() for st in stages)


def _run(rank, world, path):
    groups = initialize_model_parallel(1, world)
    model = open_model(path)
    vocab = model.config["vocab_size"]
    prompts, later = _prompts(vocab, LENGTHS, 3), _prompts(vocab, LATER, 4)
    out = {}

    def build(kind):
        layout = make_layout(kind, LAYERS, world)
        return [model.build(layout.stage_layers[s], groups) for s in layout.stages_of(rank)], 0 in layout.stages_of(rank)

    for name, schedule, kind, kw, cached in _cases():
        stages, first = build(kind)
        kw = dict(kw)
        chunk = kw.pop("chunk", CHUNK)
        ids = kw.get("request_ids", list(range(len(LENGTHS))))
        if cached:
            kw["cached_tokens"] = cached
            held = [i for i, c in enumerate(cached) if c]
            forward_prefill(stages, [prompts[i][:cached[i]] for i in held] if first else None, CHUNK, groups,
                            schedule=schedule, request_ids=[ids[i] for i in held])
        res = forward_prefill(stages, prompts if first else None, chunk, groups, schedule=schedule, **kw)
        out[name] = {i: res.all_logits[q] for i, q in enumerate(ids) if q in res.all_logits}

    stages, first = build("v")
    pipe, held = Pipeline(stages, groups), []
    for _ in range(2):
        first_stream = pipe.prefill(prompts if first else None, CHUNK, schedule="vpp-packed")
        for q in range(len(LENGTHS)):
            pipe.release(q)
        held.append(_held(stages))
        requests, steps = shared_budget_stream(LATER, CHUNK)
        second = pipe.prefill(later if first else None, _sizes(requests), schedule="vpp-packed", steps=steps)
        for q in range(len(LATER)):
            pipe.release(q)
        held.append(_held(stages))
        generation = pipe.generate(later if first else None, NEW_TOKENS, CHUNK, schedule="vpp-packed")
        held.append(_held(stages))
    out["pipeline first stream"] = dict(first_stream.all_logits)
    out["pipeline second stream"] = dict(second.all_logits)
    return out, generation.tokens, held


@pytest.mark.slow
def test_mixed_streams_match_transformers_per_request(tmp_path, worlds):
    from tests.models.hf_tiny import VOCAB, model as hf_model  # transformers: only in this process
    hf = hf_model("qwen3_moe", num_hidden_layers=LAYERS)
    hf.save_pretrained(tmp_path)
    prompts, later = _prompts(VOCAB, LENGTHS, 3), _prompts(VOCAB, LATER, 4)
    with torch.no_grad():
        ref = [hf(p[None]).logits[0, -1] for p in prompts]
        ref_later = [hf(p[None]).logits[0, -1] for p in later]
        greedy = {}
        for q, ids in enumerate(later):
            greedy[q] = []
            for _ in range(NEW_TOKENS):
                greedy[q].append(int(hf(ids[None]).logits[0, -1].argmax()))
                ids = torch.cat([ids, torch.tensor(greedy[q][-1:])])

    results = worlds.run(PP, _run, str(tmp_path), timeout=600)
    names = [c[0] for c in _cases()] + ["pipeline first stream", "pipeline second stream"]
    for name in names:
        logits = {}
        for per_rank, _, _ in results:
            logits.update(per_rank[name])
        expect = ref_later if name == "pipeline second stream" else ref
        assert sorted(logits) == list(range(len(expect))), name
        for q, e in enumerate(expect):
            torch.testing.assert_close(logits[q], e, **TOL, msg=f"{name}: request {q}")
    for rank, (_, tokens, held) in enumerate(results):
        assert tokens == greedy, rank
        assert held == [0] * 6, (rank, held)  # released: no entry, no byte left on any stage
