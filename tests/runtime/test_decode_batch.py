"""Several requests decoded in one batch, in one process, against transformers' greedy ``generate`` of
each prompt alone (tests/runtime/test_generate.py runs one request, or two packed, on spawned grids).

Four prompts of 37, 29, 5 and 1 tokens (ragged against chunks of 8; two shorter than one chunk) with
request ids out of order, prefilled with vpp over three stages on one rank ([0, 2), [2, 4), [4, 6)) and
decoded together; DeepSeek-V3.2's 5-token prompt crosses index_topk (8) while decoding, so a batch mixes
dense and sparse rows. Then one new token only (no decode step), a request that stops at its
``eos_token_id`` while the other goes on, and a generation that continues a cached prefix
(``cached_tokens``). Every call leaves no caches behind.
"""

from __future__ import annotations

import pytest
import torch

from tests.models.hf_tiny import VOCAB, model as hf_model

NEW = 6
LENGTHS = (37, 29, 5, 1)
IDS = (10, 3, 7, 0)


@pytest.fixture(scope="module", params=("qwen3_moe", "deepseek_v32"))
def case(request, tmp_path_factory):
    """A pipeline of the saved checkpoint, the prompts and transformers' greedy tokens for each."""
    from vpp.models.registry import open_model
    from vpp.parallel import ParallelGroups
    from vpp.runtime import Pipeline

    m = hf_model(request.param, num_hidden_layers=6)
    path = tmp_path_factory.mktemp("decode-batch") / request.param
    m.save_pretrained(path)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g) for n in LENGTHS]
    with torch.no_grad():
        want = [m.generate(p[None], attention_mask=torch.ones_like(p)[None], max_new_tokens=NEW, do_sample=False,
                           pad_token_id=0, eos_token_id=None)[0, p.numel():].tolist() for p in prompts]
    source, single = open_model(str(path)), ParallelGroups.single()
    pipe = Pipeline([source.build(r, single) for r in ((0, 2), (2, 4), (4, 6))], single)
    return pipe, prompts, want


def _nothing_left(pipe):
    assert all(not st.requests() for st in pipe.stages), [st.requests() for st in pipe.stages]


def test_requests_of_different_lengths_decode_together(case):
    pipe, prompts, want = case
    gen = pipe.generate(prompts, NEW, 8, schedule="vpp", request_ids=list(IDS))
    assert [gen.tokens[q] for q in IDS] == want
    assert gen.steps == NEW - 1
    _nothing_left(pipe)


def test_one_new_token_runs_no_decode_step(case):
    pipe, prompts, want = case
    gen = pipe.generate(prompts[:2], 1, 5, schedule="vpp")
    assert (gen.tokens, gen.steps) == ({0: want[0][:1], 1: want[1][:1]}, 0)
    _nothing_left(pipe)


def test_a_request_at_its_eos_leaves_the_batch(case):
    pipe, prompts, want = case
    eos = want[0][2]  # the first request's third token
    gen = pipe.generate(prompts[:2], NEW, 8, schedule="vpp", eos_token_id=eos)
    other = want[1][:want[1].index(eos) + 1] if eos in want[1] else want[1]
    assert gen.tokens == {0: want[0][:3], 1: other}
    _nothing_left(pipe)


def test_a_generation_continues_a_cached_prefix(case):
    pipe, prompts, want = case
    pipe.prefill(prompts[0][:13], 5, schedule="vpp", request_ids=[7])
    gen = pipe.generate(prompts[0], NEW, 8, schedule="vpp", request_ids=[7], cached_tokens=13)
    assert gen.tokens == {7: want[0]}
    _nothing_left(pipe)
