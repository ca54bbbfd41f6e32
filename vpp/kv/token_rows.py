"""Which cached rows go where when a context-parallel cache changes layout (no process group).

Under context parallelism a request's caches are sharded by token: CP rank ``c`` holds rows whose
tokens are ``held[c]`` (in row order; the head-tail split of every chunk, so ``held[c]`` is a
handful of runs, :func:`vpp.transformer.attention.context_parallel.Split`). Without CP there is one
shard, ``held[0] = 0 .. tokens - 1``. A KV hand-over or a directory of KV files moves rows from the
writer's shards to the reader's (:mod:`vpp.kv.handover`, :mod:`vpp.kv.files`):

* :func:`reader_shards`: the tokens each of the reader's ``cp`` ranks holds afterwards, a pure
  function of the writer's shards, so every rank of both sides computes the same: the writer's
  own shards when the two CP sizes agree (each reader CP rank takes one writer shard whole, no
  reordering), every token in order at ``cp = 1``, else the head-tail split of all the tokens as
  one chunk (each rank ``ceil(tokens / cp)`` rows or one piece fewer, balanced for decoding);
* :func:`rows_between`: for one writer shard and one reader shard, the rows of each that hold the
  tokens both hold, in the writer's row order: the writer takes those rows (``index_select``), the
  reader puts them at its rows (``index_copy_``). Every token reaches every reader rank that holds
  it exactly once.

Positions are stored compactly as runs ``[[start, end], ...]`` (:func:`to_runs`, :func:`from_runs`):
two runs per chunk and CP rank, whatever the prompt's length.
"""

from __future__ import annotations

from typing import Sequence

import torch

from vpp.transformer.attention.context_parallel import Split


def to_runs(positions: Sequence[int] | torch.Tensor) -> list[list[int]]:
    """``positions`` as maximal runs of consecutive tokens ``[[start, end), ...]``, in order."""
    out: list[list[int]] = []
    for p in (positions.tolist() if isinstance(positions, torch.Tensor) else positions):
        if out and out[-1][1] == p:
            out[-1][1] = p + 1
        else:
            out.append([int(p), int(p) + 1])
    return out


def from_runs(runs: Sequence[Sequence[int]]) -> torch.Tensor:
    """The positions of ``runs`` (LongTensor, in run order)."""
    parts = [torch.arange(int(a), int(b)) for a, b in runs]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def coverage_problem(shards: Sequence[Sequence[Sequence[int]]], tokens: int) -> str | None:
    """Why the shards (each as runs, :func:`to_runs`) do not hold each of ``tokens`` tokens exactly once,
    or None. Arithmetic on the runs alone: a manifest claiming 10^12 tokens allocates nothing here."""
    runs = sorted((int(a), int(b)) for shard in shards for a, b in shard)
    rows = sum(b - a for a, b in runs)
    covered = beyond = 0
    end = 0  # the furthest token reached so far
    for a, b in runs:
        beyond += max(0, b - max(a, tokens))
        a, b = max(0, min(a, tokens)), max(0, min(b, tokens))
        covered += max(0, b - max(a, end))
        end = max(end, b)
    repeated = rows - beyond - covered
    if covered != tokens or repeated or beyond:
        return (f"the {len(shards)} shards hold {rows} rows for {tokens} tokens: {tokens - covered} tokens missing, "
                f"{repeated} rows repeating a token, {beyond} rows past the last token")
    return None


def reader_shards(held: Sequence[torch.Tensor], tokens: int, cp: int) -> list[torch.Tensor]:
    """The tokens each of a reader's ``cp`` CP ranks holds, in its row order (see the module docstring)."""
    if cp == len(held):
        return [h.clone() for h in held]
    if cp == 1:
        return [torch.arange(tokens)]
    split = Split(tokens, cp)
    return [split.index(r) for r in range(cp)]


def rows_between(src: torch.Tensor, dst: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows of ``src``, rows of ``dst``) holding the tokens both shards hold, in ``src``'s row order."""
    where = torch.full((tokens,), -1, dtype=torch.long)
    where[dst] = torch.arange(len(dst))
    at = where[src]
    keep = (at >= 0).nonzero().flatten()
    return keep, at[keep]


__all__ = ["coverage_problem", "from_runs", "reader_shards", "rows_between", "to_runs"]
