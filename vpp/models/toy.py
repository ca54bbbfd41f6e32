"""A toy model that follows the stage contract, for schedule tests and as the smallest example of
wiring a model into vpp's pipeline.

Each layer mixes every token with the running mean of all earlier tokens of its request (a causal
"attention" whose KV cache is a running sum), so a chunk computed out of order, with a missing or
duplicated prefix, or against another request's cache gives different numbers. Weights come from
``(seed, layer)`` alone, so any split into stages holds the same model.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn


def _weight(seed: int, name: str, *shape: int, scale: float, dtype: torch.dtype) -> nn.Parameter:
    g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
    return nn.Parameter((torch.randn(*shape, generator=g) * scale).to(dtype), requires_grad=False)


class ToyStage(nn.Module):
    """Layers ``[start, end)`` of a ``num_layers``-layer toy model (embedding on the stage that holds
    layer 0, LM head on the one that holds the last layer)."""

    def __init__(self, layer_range: tuple[int, int], num_layers: int, *, hidden_size: int = 16,
                 vocab_size: int = 64, seed: int = 0, max_positions: int = 1 << 20,
                 dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        start, end = layer_range
        if not 0 <= start < end <= num_layers:
            raise ValueError(f"layer range [{start}, {end}) outside a {num_layers}-layer model")
        self.layer_range, self.num_layers = (start, end), num_layers
        self.is_first, self.is_last = start == 0, end == num_layers
        self.hidden_size, self.vocab_size, self.max_positions, self.dtype = hidden_size, vocab_size, max_positions, dtype
        s = hidden_size ** -0.5
        self.embed = _weight(seed, "embed", vocab_size, hidden_size, scale=1.0, dtype=dtype) if self.is_first else None
        self.layers = nn.ParameterDict({str(i): _weight(seed, f"layer{i}", hidden_size, hidden_size, scale=s, dtype=dtype)
                                        for i in range(start, end)})
        self.head = _weight(seed, "head", vocab_size, hidden_size, scale=s, dtype=dtype) if self.is_last else None
        self._cache: dict[int, dict[str, torch.Tensor | int]] = {}
        if device is not None:
            self.to(device)  # weights are drawn on the host (seeded), then moved

    def cache_length(self, request: int) -> int:
        return int(self._cache[request]["length"]) if request in self._cache else 0

    def requests(self) -> list[int]:
        return list(self._cache)

    def release(self, request: int) -> None:
        self._cache.pop(request, None)

    def forward(self, x: torch.Tensor, request: int, offset: int, *, last_token_only: bool = False) -> torch.Tensor:
        have = self.cache_length(request)
        if offset != have:
            raise ValueError(f"request {request}: chunk at offset {offset}, but stage {self.layer_range} has "
                             f"{have} tokens cached")
        h = self.embed[x] if self.is_first else x.to(self.dtype)
        cache = self._cache.setdefault(request, {"length": 0})
        count = torch.arange(offset + 1, offset + h.shape[0] + 1, dtype=self.dtype, device=h.device).unsqueeze(-1)
        for i, w in self.layers.items():
            prev = cache.get(i, torch.zeros(self.hidden_size, dtype=self.dtype, device=h.device))
            running = torch.cumsum(h, dim=0) + prev
            cache[i] = running[-1]
            h = h + 0.5 * torch.tanh((h + running / count) @ w)
        cache["length"] = offset + h.shape[0]
        if not self.is_last:
            return h
        if last_token_only:
            h = h[-1:]
        return h @ self.head.T


__all__ = ["ToyStage"]
