"""The sampler against its definition: greedy is the argmax; draws follow the temperature-scaled,
top-k and top-p cut distribution; the same seed gives the same tokens."""

from __future__ import annotations

import pytest
import torch

from vpp.runtime import Sampler


def test_greedy_is_the_argmax():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    assert Sampler().sample(logits).tolist() == logits.argmax(-1).tolist()


def test_distribution_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625]]))
    # temperature 1, no cut: the softmax itself
    torch.testing.assert_close(Sampler(1.0).probabilities(logits), torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625]]))
    # top-k 2: the two best, renormalised
    torch.testing.assert_close(Sampler(1.0, top_k=2).probabilities(logits), torch.tensor([[2 / 3, 1 / 3, 0, 0, 0]]))
    # top-p 0.7: 0.5 alone is short of 0.7, 0.5 + 0.25 reaches it: two tokens kept
    torch.testing.assert_close(Sampler(1.0, top_p=0.7).probabilities(logits), torch.tensor([[2 / 3, 1 / 3, 0, 0, 0]]))
    # top-p 0.5: the first token's mass already reaches it
    torch.testing.assert_close(Sampler(1.0, top_p=0.5).probabilities(logits), torch.tensor([[1.0, 0, 0, 0, 0]]))
    # temperature 2 flattens: p ~ sqrt(p)
    sq = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625]).sqrt()
    torch.testing.assert_close(Sampler(2.0).probabilities(logits), (sq / sq.sum())[None])


def test_draws_follow_the_distribution_and_repeat_with_the_seed():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0]]).clamp(min=1e-30)).repeat(20000, 1)
    a, b = Sampler(1.0, seed=3).sample(logits), Sampler(1.0, seed=3).sample(logits)
    assert torch.equal(a, b)
    freq = torch.bincount(a, minlength=4).float() / a.numel()
    assert freq[3] == 0
    torch.testing.assert_close(freq[:3], torch.tensor([0.5, 0.3, 0.2]), atol=0.02, rtol=0)  # ~6 sigma
    assert not torch.equal(a[:200], Sampler(1.0, seed=4).sample(logits[:200]))


def test_cut_tokens_are_never_drawn():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 40, generator=g) * 3
    tokens = Sampler(1.5, top_k=5, seed=0).sample(logits)
    top5 = logits.topk(5, dim=-1).indices
    assert all(t in row for t, row in zip(tokens.tolist(), top5.tolist()))


@pytest.mark.parametrize("kw, message", [
    (dict(temperature=-1), "temperature=-1"), (dict(top_k=-2), "top_k=-2"), (dict(top_p=0), "top_p=0"),
    (dict(top_p=1.5), "top_p=1.5"), (dict(temperature=True), "temperature=True"),
])
def test_bad_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        Sampler(**kw)


@pytest.mark.parametrize("kw, message", [
    (dict(temperature=float("nan")), r"temperature=nan must be a finite number >= 0"),  # failed at the first draw
    (dict(temperature=float("inf")), r"temperature=inf must be a finite number >= 0"),  # drew uniformly, silently
    (dict(seed=1.5), r"seed=1.5 must be an integer"),                                   # was seed 1, silently
    (dict(seed="x"), r"seed='x' must be an integer"),
    (dict(seed=None), r"seed=None must be an integer"),
    (dict(seed=2 ** 70), r"seed=1180591620717411303424 must be an integer in \[-2\*\*63, 2\*\*64\)"),
])
def test_non_finite_and_non_integer_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        Sampler(**kw)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_nan_logits_pick_no_token(temperature):
    """argmax over a NaN row returned the NaN's index as if it were a token."""
    logits = torch.zeros(2, 8)
    logits[1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"logits rows \[1\] hold NaN or \+Inf"):
        Sampler(temperature).sample(logits)
    masked = torch.zeros(1, 8)
    masked[0, :7] = float("-inf")  # -inf masks tokens: still a valid distribution
    assert Sampler(temperature).sample(masked).tolist() == [7]
