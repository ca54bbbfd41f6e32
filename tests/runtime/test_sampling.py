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
