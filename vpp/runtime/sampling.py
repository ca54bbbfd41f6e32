"""Choosing the next token from logits: greedy, or temperature / top-k / top-p sampling with a seeded
generator.

Every rank of a pipeline holds the same logits (:mod:`.decode` broadcasts them) and makes the same
sequence of calls, so a :class:`Sampler` built with the same seed on every rank picks the same tokens
everywhere, and again on the next run. Sampling runs on the CPU in float32 (the draws do not depend
on the device).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch


@dataclass
class Sampler:
    """``temperature`` 0 means greedy (argmax; ``top_k``/``top_p`` unused). Otherwise the logits are
    divided by ``temperature``, cut to the ``top_k`` most likely tokens (0: all), then to the smallest
    set whose probability reaches ``top_p`` (1: all), renormalised, and one token is drawn."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, numbers.Real) \
                or not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature={self.temperature!r} must be a finite number >= 0 (0: greedy)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be an integer >= 0 (0: no cut)")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, numbers.Real) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r} must lie in (0, 1]")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) \
                or not -(1 << 63) <= self.seed < (1 << 64):
            raise ValueError(f"seed={self.seed!r} must be an integer in [-2**63, 2**64)")
        self.generator = torch.Generator().manual_seed(int(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution tokens are drawn from, [B, vocab] (one-hot of the argmax when greedy)."""
        logits = logits.float().cpu()
        if self.greedy:
            return torch.zeros_like(logits).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
        logits = logits / self.temperature
        if self.top_k and self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the tokens ranked above each one
            drop = torch.zeros_like(probs, dtype=torch.bool).scatter(1, order, before >= self.top_p)
            probs = probs.masked_fill(drop, 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """One token per row of ``logits`` [B, vocab] -> LongTensor [B]."""
        if logits.dim() != 2:
            raise ValueError(f"logits must be [batch, vocab], got {tuple(logits.shape)}")
        bad = (logits.isnan() | (logits == float("inf"))).any(-1)  # argmax would pick a NaN; -inf masks a token
        if bool(bad.any()):
            raise ValueError(f"logits rows {bad.nonzero().flatten().tolist()} hold NaN or +Inf: no token to pick")
        if self.greedy:
            return logits.float().argmax(-1).cpu()
        return torch.multinomial(self.probabilities(logits), 1, generator=self.generator)[:, 0]


__all__ = ["Sampler"]
