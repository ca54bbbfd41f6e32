"""API values are checked before any work, with one message (single process: the checks that every
rank makes alike; tests/runtime/test_executor.py shows prompt problems reaching every rank)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vpp.models.toy import ToyStage
from vpp.parallel import ParallelGroups
from vpp.runtime import forward_prefill

VOCAB = 64


def _stage():
    return [ToyStage((0, 2), 2, vocab_size=VOCAB)]


def _ids(n=24):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(0))


def _run(prompt, chunk, **kw):
    return forward_prefill(_stage(), prompt, chunk, ParallelGroups.single(), schedule="cpp", **kw)


@pytest.mark.parametrize("chunk, message", [
    (8.0, r"chunk_size must be a positive integer, a function of the prompt length, or chunk sizes per prompt; got float 8.0"),
    ("8", r"got str '8'"),
    (True, r"got bool True"),
    (0, r"chunk_size=0 must be >= 1"),
    (-3, r"chunk_size=-3 must be >= 1"),
    ([[8, 8.5, 7.5]], r"chunk sizes of prompt 0 must be positive integers, got \[8, 8.5, 7.5\]"),
    ([[8, 0, 16]], r"chunk sizes of prompt 0 must be positive integers"),
    ([8, 16], r"chunk sizes of prompt 0 must be a sequence of positive integers, got int 8"),
    ([[8, 8]], r"request 0: chunk sizes sum to 16 but the prompt has 24 tokens"),
    (lambda n: [n / 2, n / 2], r"chunk sizes the chunking function gave for 24 tokens must be positive integers"),
])
def test_bad_chunking_is_one_clear_error(chunk, message):
    with pytest.raises(ValueError, match=message):
        _run(_ids(), chunk)


@pytest.mark.parametrize("kw, message", [
    (dict(timeout_s=-1), r"timeout_s=-1 must be a finite number of seconds > 0"),
    (dict(timeout_s=0), r"timeout_s=0 must be a finite number of seconds > 0"),
    (dict(timeout_s=True), r"timeout_s=True must be a finite number of seconds > 0"),
    (dict(concurrency=0), r"concurrency=0 must be a positive integer or None"),
    (dict(schedule="vpp-typo"), r"unknown strategy 'vpp-typo'; choose one of cpp, dcpp, vpp, vpp-async, vpp-packed"),
])
def test_bad_options_are_one_clear_error(kw, message):
    with pytest.raises(ValueError, match=message):
        forward_prefill(_stage(), _ids(), 8, ParallelGroups.single(), **{"schedule": "cpp", **kw})


def test_repeated_request_ids_are_refused():
    with pytest.raises(ValueError, match=r"request ids must be unique; \[7\] repeat in \[7, 7\]"):
        _run([_ids(), _ids(16)], 8, request_ids=[7, 7])


@pytest.mark.parametrize("prompt, message", [
    ([], r"no prompts given \(an empty list\)"),
    ("hello", r"the prompt must be a 1-D tensor of token ids, a list of ints, or a list of prompts; got str"),
    ([[1, 2], [3, "x"]], r"prompt 1 must be a 1-D tensor of token ids or a non-empty list of ints"),
    (torch.zeros(2, 3, dtype=torch.long), r"prompt must be a 1-D tensor of token ids, got shape \(2, 3\)"),
])
def test_bad_prompts_are_one_clear_error(prompt, message):
    with pytest.raises(ValueError, match=message):
        _run(prompt, 8)


def test_accepted_spellings_give_the_same_logits():
    """numpy chunk sizes, a list of ints as the prompt and [1, n] tensors mean what they say."""
    ids = _ids()
    ref = _run(ids, 8).logits
    for prompt, chunk in ((ids.tolist(), 8), (ids[None], np.int64(8)), (ids, [[np.int32(8)] * 3]),
                          (ids, lambda n: [16, n - 16])):
        torch.testing.assert_close(_run(prompt, chunk).logits, ref)


@pytest.mark.parametrize("kw, message", [
    (dict(cached_tokens=2.0), r"cached_tokens=2.0 must be a token count >= 0, or one per prompt"),
    (dict(cached_tokens=30), r"^request 0: cached_tokens=30 leaves nothing to prefill of its 24-token prompt$"),
    (dict(cached_tokens=[24]), r"^request 0: cached_tokens=24 leaves nothing to prefill of its 24-token prompt$"),
    (dict(arrivals=0.0), r"arrivals must be one time in seconds per prompt, got float 0.0"),
    (dict(steps=5), r"steps must be lists of \(prompt index, chunk index\) pairs: got int 5"),
    (dict(steps=[[(0, 0)], [(5, 0)]]), r"step 1 names prompt 5, but there are 1 prompts"),
    (dict(steps=[[(0, -1)]]), r"step 0 holds \(0, -1\)"),
    (dict(request_ids=[[1]]), r"request_ids must be integers >= 0 \(the plan numbers requests by them\); got \[1\]"),
    (dict(request_ids=["a"]), r"request_ids must be integers >= 0 .*got 'a'"),
    (dict(timeout_s=float("inf")), r"timeout_s=inf must be a finite number of seconds > 0"),
])
def test_malformed_options_name_the_argument(kw, message):
    """Each was a TypeError or IndexError from deep inside that named no argument."""
    with pytest.raises(ValueError, match=message):
        _run(_ids(), 8, **kw)


def test_a_chunking_function_must_return_sizes():
    with pytest.raises(ValueError, match=r"chunk sizes the chunking function gave for 24 tokens must be a sequence "
                                         r"of positive integers, got int 8"):
        _run(_ids(), lambda n: 8)


def test_groups_and_stages_are_checked():
    with pytest.raises(TypeError, match=r"groups must be a ParallelGroups .* got NoneType"):
        forward_prefill(_stage(), _ids(), 8, None, schedule="cpp")
    with pytest.raises(ValueError, match=r"stage modules do not form a whole model: the last stage \[0, 1\] holds no "
                                         r"LM head \(is_last=False\)"):  # was a bare StopIteration
        forward_prefill([ToyStage((0, 1), 2, vocab_size=VOCAB)], _ids(), 8, ParallelGroups.single(), schedule="cpp")


@pytest.mark.parametrize("budget", [0, -5, 8.5, "8"])
def test_dcpp_budget_is_checked_before_profiling(budget):
    from vpp.runtime import forward_dcpp_prefill
    with pytest.raises(ValueError, match=rf"budget={budget!r} must be a positive integer number of tokens"):
        forward_dcpp_prefill(_stage(), _ids(), budget, ParallelGroups.single())


def test_arrivals_take_any_real_number_and_refuse_by_name():
    """numpy float32 arrivals (a Real, not a float) were refused as "arrivals must be seconds >= 0, got
    [np.float32(0.0), ...]": values that are >= 0. NaN and inf were caught later, per request."""
    prompts = [_ids(), _ids(5)]
    ref = [ToyStage((0, 2), 2, vocab_size=VOCAB)(p, q, 0, last_token_only=True)[-1] for q, p in enumerate(prompts)]
    out = _run(prompts, 8, arrivals=[np.float32(0.0), np.float32(0.001)])
    for q, expect in enumerate(ref):
        torch.testing.assert_close(out.all_logits[q], expect)
    for bad, text in ((-1.0, "-1.0"), (float("nan"), "nan"), (float("inf"), "inf"), (True, "True")):
        with pytest.raises(ValueError, match=rf"^arrivals must be finite seconds >= 0, got {text} in \[0.0, {text}\]$"):
            _run(prompts, 8, arrivals=[0.0, bad])
