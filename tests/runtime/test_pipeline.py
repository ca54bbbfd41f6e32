"""A Pipeline used out of order (one process, the toy model): a live request prefilled again, a
generation too long for the model, a released or unknown request decoded, bad decode tokens. Each is
refused in one line before any work, and the caches already there stay as they were."""

from __future__ import annotations

import pytest
import torch

from vpp.models.toy import ToyStage
from vpp.parallel import ParallelGroups
from vpp.runtime import Pipeline

VOCAB, POSITIONS = 64, 40


def _pipe():
    return Pipeline([ToyStage((0, 2), 2, vocab_size=VOCAB, max_positions=POSITIONS)], ParallelGroups.single())


def _ids(n=24):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(0))


def _continued(pipe, token=5):
    """The next-token logits after one decode step of request 0."""
    return pipe.decode(torch.tensor([token]), [0])


def test_a_live_request_prefilled_again_is_refused_and_keeps_its_caches():
    """Before: the second prefill failed mid-plan ("chunk at offset 0, but ... 24 tokens cached") and
    its clean-up released request 0, destroying the first prefill's caches."""
    pipe, ref = _pipe(), _pipe()
    pipe.prefill(_ids(), 8, schedule="cpp")
    ref.prefill(_ids(), 8, schedule="cpp")
    with pytest.raises(ValueError, match=r"request 0 already holds 24 tokens in the caches of stage \[0, 2\] on "
                                         r"global rank 0 \(cached_tokens=0\): release it first, or pass "
                                         r"cached_tokens=24 to continue it"):
        pipe.prefill(_ids(), 8, schedule="cpp")
    assert pipe.stages[0].cache_length(0) == 24
    torch.testing.assert_close(_continued(pipe), _continued(ref), rtol=0, atol=0)


def test_a_generation_past_the_positions_is_refused_before_the_prefill():
    """Before: the prompt was prefilled first, then refused, and its caches stayed behind, so the next
    generate of request 0 failed in the middle of its plan."""
    pipe = _pipe()
    with pytest.raises(ValueError, match=r"a prompt of 24 tokens and 19 tokens to decode after it "
                                         r"\(max_new_tokens=20\) exceed the model's 40 positions"):
        pipe.generate(_ids(), 20, 8)
    assert pipe.stages[0].requests() == []
    out = pipe.generate(_ids(), 17, 8)  # 24 + 16 cached positions: exactly the model's 40
    assert len(out.tokens[0]) == 17


def test_a_released_or_unknown_request_is_not_decoded():
    """Before: decode started the request from an empty cache and returned logits, silently."""
    pipe = _pipe()
    pipe.prefill(_ids(), 8, schedule="cpp")
    pipe.release(0)
    for q in (0, 99):
        with pytest.raises(ValueError, match=rf"request {q} holds no caches on stage \[0, 2\] \(global rank 0\): "
                                             r"prefill it \(or load its caches\) before decoding"):
            pipe.decode(torch.tensor([1]), [q])
    assert pipe.stages[0].requests() == []


@pytest.mark.parametrize("tokens, message", [
    (torch.tensor([-1]), r"decode tokens hold ids in \[-1, -1\] outside the vocabulary \[0, 64\)"),  # was embed[-1]
    (torch.tensor([64]), r"decode tokens hold ids in \[64, 64\] outside the vocabulary \[0, 64\)"),
    (torch.tensor([1.0]), r"decode tokens must be integer token ids, got torch.float32"),
    ([1], r"decode tokens must be a 1-D tensor of token ids, got list"),
])
def test_bad_decode_tokens_are_refused_and_append_nothing(tokens, message):
    pipe, ref = _pipe(), _pipe()
    pipe.prefill(_ids(), 8, schedule="cpp")
    ref.prefill(_ids(), 8, schedule="cpp")
    with pytest.raises(ValueError, match=message):
        pipe.decode(tokens, [0])
    assert pipe.stages[0].cache_length(0) == 24
    torch.testing.assert_close(_continued(pipe), _continued(ref), rtol=0, atol=0)


def test_decoding_past_the_positions_is_refused():
    """Before: the caches grew to 41 positions of a 40-position model, silently."""
    pipe = _pipe()
    pipe.prefill(torch.zeros(POSITIONS, dtype=torch.long), 8, schedule="cpp")
    with pytest.raises(ValueError, match=r"request 0 holds 40 tokens: one more exceeds the model's 40 positions"):
        pipe.decode(torch.tensor([1]), [0])
    assert pipe.stages[0].cache_length(0) == POSITIONS


def test_generate_takes_a_sampler():
    with pytest.raises(ValueError, match=r"sampler must be a vpp.runtime.Sampler or None \(greedy\), got str"):
        _pipe().generate(_ids(), 2, 8, sampler="greedy")


def test_a_generation_whose_callback_raises_leaves_no_caches_behind():
    """Before: an ``on_tokens`` that raised left request 0's caches in place, and the next generate of
    request 0 was refused ("already holds ... release it first"). With release=False the caller keeps
    them, as asked."""
    pipe = _pipe()

    def stop_at_three(tokens):
        if len(tokens[0]) == 3:
            raise KeyboardInterrupt("enough")
    with pytest.raises(KeyboardInterrupt, match="enough"):
        pipe.generate(_ids(), 8, 8, on_tokens=stop_at_three)
    assert pipe.stages[0].requests() == []
    assert len(pipe.generate(_ids(), 8, 8).tokens[0]) == 8
    with pytest.raises(KeyboardInterrupt):
        pipe.generate(_ids(), 8, 8, on_tokens=stop_at_three, release=False)
    assert pipe.stages[0].cache_length(0) == 24 + 2  # the prompt and the two tokens decoded before the stop
