"""What every attention layer of a stage is told about the chunk it processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import torch


@dataclass
class Chunk:
    """One chunk of one request: its tokens are positions ``offset .. offset + len - 1``.

    ``cos``/``sin`` are the rotary tables of those positions ([len, rope_dim]), computed once per
    stage call. ``topk`` carries a DSA layer's top-k selection ([len, k] key positions, -1 where a
    query has fewer than k keys) to the following layers that share it (GLM-5's shared indexers).
    """

    request: Hashable
    offset: int
    cos: torch.Tensor
    sin: torch.Tensor
    topk: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.cos.shape[0]
