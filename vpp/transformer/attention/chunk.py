"""What every attention layer of a stage is told about the tokens it processes: a :class:`Chunk` of
one request (prefill), or a :class:`Batch` of one new token for each of several requests (a decode
step: projections and MLPs run on the whole batch, attention row by row against each request's own
cache)."""

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
    Under context parallelism the tokens are this rank's share (``cp``, see
    :mod:`.context_parallel`): ``cos``/``sin`` are their global positions' tables and ``topk`` holds
    global key positions.
    """

    request: Hashable
    offset: int
    cos: torch.Tensor
    sin: torch.Tensor
    topk: torch.Tensor | None = None
    cp: object | None = None  # context parallelism: a CPChunk (prefill) or CPStep (decode row), else None

    @property
    def size(self) -> int:
        return self.cos.shape[0]


@dataclass
class Batch:
    """One token for each of several requests: row ``i`` is position ``rows[i].offset`` of request
    ``rows[i].request`` (each row a one-token :class:`Chunk`, with its own rotary row and, under DSA,
    its own top-k). ``cos``/``sin`` stack the rows' rotary tables ([B, rope_dim])."""

    rows: list[Chunk]
    cos: torch.Tensor
    sin: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.rows)


__all__ = ["Batch", "Chunk"]
