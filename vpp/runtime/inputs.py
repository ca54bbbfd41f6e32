"""Checking what a caller hands the pipeline, before any rank does work.

Values every rank is given alike (chunking, timeouts, request ids) are checked locally and raise the
same ``ValueError`` on every rank. Prompts are given only to the ranks that hold stage 0: a problem
with them is carried through the start-up exchange (:mod:`.handshake`) so that every rank raises it,
instead of one rank raising while the others wait.
"""

from __future__ import annotations

import hashlib
import numbers
from typing import Any, Callable, Hashable, Iterable, Sequence

import torch

from vpp.schedules.ir import Request, chunk_requests, is_count

Chunking = int | Sequence[Sequence[int]] | Callable[[int], Sequence[int]]


def check_chunking(chunk_size: Any) -> Chunking:
    """A positive integer, a function of a prompt length, or one sequence of positive integers per
    prompt. Returns it with numpy integers made Python ints."""
    if callable(chunk_size):
        return chunk_size
    if is_count(chunk_size):
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size} must be >= 1")
        return int(chunk_size)
    if isinstance(chunk_size, (str, bytes)) or not isinstance(chunk_size, Sequence):
        raise ValueError(f"chunk_size must be a positive integer, a function of the prompt length, or chunk "
                         f"sizes per prompt; got {type(chunk_size).__name__} {chunk_size!r}")
    out = []
    for i, sizes in enumerate(chunk_size):
        if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
            raise ValueError(f"chunk sizes of prompt {i} must be a sequence of positive integers, got "
                             f"{type(sizes).__name__} {sizes!r}")
        out.append(tuple(check_sizes(sizes, f"chunk sizes of prompt {i}")))
    return out


def check_sizes(sizes: Sequence[Any], what: str) -> list[int]:
    bad = [c for c in sizes if not is_count(c) or c < 1]
    if bad or not len(sizes):
        raise ValueError(f"{what} must be positive integers, got {list(sizes)!r}")
    return [int(c) for c in sizes]


def check_timeout(timeout_s: Any) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not 0 < timeout_s < float("inf"):
        raise ValueError(f"timeout_s={timeout_s!r} must be a finite number of seconds > 0")
    return float(timeout_s)


def check_request_ids(ids: Sequence[Any], count: int) -> list:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise ValueError(f"request_ids must be a list of integers >= 0, one per prompt; got {type(ids).__name__}")
    ids = list(ids)
    bad = [q for q in ids if not is_count(q) or q < 0]
    if bad:
        raise ValueError(f"request_ids must be integers >= 0 (the plan numbers requests by them); got {bad[0]!r} "
                         f"in {ids}")
    ids = [int(q) for q in ids]
    if len(ids) != count:
        raise ValueError(f"{len(ids)} request ids for {count} prompts")
    seen, repeated = set(), []
    for q in ids:
        if q in seen and q not in repeated:
            repeated.append(q)
        seen.add(q)
    if repeated:
        raise ValueError(f"request ids must be unique; {repeated} repeat in {ids}")
    return ids


def check_steps(steps: Any, ids: Sequence[Any]) -> tuple:
    """Shared steps as given (lists of (prompt index, chunk index) pairs) with request ids in place of
    prompt indices; one line naming what is wrong otherwise."""
    def bad(why: str) -> ValueError:
        return ValueError(f"steps must be lists of (prompt index, chunk index) pairs: {why}")
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
        raise bad(f"got {type(steps).__name__} {steps!r:.60}")
    out = []
    for i, step in enumerate(steps):
        if isinstance(step, (str, bytes)) or not isinstance(step, Sequence) or not step:
            raise bad(f"step {i} is {step!r:.60}")
        pairs = []
        for pair in step:
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2 \
                    or not all(is_count(x) and x >= 0 for x in pair):
                raise bad(f"step {i} holds {pair!r:.60}")
            q, c = int(pair[0]), int(pair[1])
            if q >= len(ids):
                raise bad(f"step {i} names prompt {q}, but there are {len(ids)} prompts")
            pairs.append((ids[q], c))
        out.append(tuple(pairs))
    return tuple(out)


def call_signature(**arguments: Any) -> tuple[tuple[str, str], ...]:
    """The arguments every rank must give alike, as (name, short text) pairs compared after the
    prompts' exchange (:func:`call_disagreement`): a chunk size of 8 on one rank and 16 on another
    would otherwise build different plans, which abort in gloo or hang until the timeout. A function
    is named by its qualified name (its identity differs between processes); a long value by a hash."""
    out = []
    for name, value in arguments.items():
        if callable(value):
            text = f"function {getattr(value, '__qualname__', type(value).__name__)}"
        else:
            text = repr(_plain(value))
            if len(text) > 80:
                text = f"{text[:60]}... (blake2b {hashlib.blake2b(text.encode(), digest_size=6).hexdigest()})"
        out.append((name, text))
    return tuple(out)


def _plain(value: Any) -> Any:
    """numpy numbers as Python ones, sequences as lists (their repr is then the same on every rank)."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, bytes)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (Sequence, range)):
        return [_plain(v) for v in value]
    return value


def call_disagreement(infos: Sequence[Any]) -> str | None:
    """The first argument whose :func:`call_signature` differs between ranks, naming two of them, or
    None. ``infos`` carry ``global_rank`` and ``call``."""
    first = infos[0]
    for info in infos[1:]:
        for (name, mine), (_, theirs) in zip(first.call, info.call):
            if mine != theirs:
                return (f"ranks were given different {name}: global rank {first.global_rank} has {mine}, global "
                        f"rank {info.global_rank} has {theirs}; every rank must make the same call")
    return None


def as_prompts(input_ids: Any) -> tuple[list[torch.Tensor] | None, str | None]:
    """(prompts, problem). One prompt is a 1-D integer tensor ([1, n] is taken as [n]) or a list of
    ints; several prompts are a list of those. A problem is returned, not raised (see the module
    docstring)."""
    if input_ids is None:
        return None, None
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2 and input_ids.shape[0] == 1:
            input_ids = input_ids.reshape(-1)
        return [input_ids], None
    if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, Sequence):
        return None, (f"the prompt must be a 1-D tensor of token ids, a list of ints, or a list of prompts; got "
                      f"{type(input_ids).__name__}")
    items = list(input_ids)
    if not items:
        return None, "no prompts given (an empty list)"
    if all(is_count(t) for t in items):
        return [torch.tensor([int(t) for t in items], dtype=torch.long)], None
    prompts = []
    for i, item in enumerate(items):
        if isinstance(item, torch.Tensor):
            prompts.append(item)
        elif isinstance(item, Sequence) and not isinstance(item, (str, bytes)) and item and all(is_count(t) for t in item):
            prompts.append(torch.tensor([int(t) for t in item], dtype=torch.long))
        else:
            return None, (f"prompt {i} must be a 1-D tensor of token ids or a non-empty list of ints; got "
                          f"{type(item).__name__} {str(item)[:40]}")
    return prompts, None


def cached_counts(cached_tokens: int | Sequence[int], n: int) -> list[int]:
    """``cached_tokens`` as one count per prompt (a single count applies to every prompt)."""
    if is_count(cached_tokens):
        values = [cached_tokens] * n
    elif isinstance(cached_tokens, Sequence) and not isinstance(cached_tokens, (str, bytes)):
        values = list(cached_tokens)
    else:
        values = None
    if values is None or len(values) != n or any(not is_count(c) or c < 0 for c in values):
        raise ValueError(f"cached_tokens={cached_tokens!r} must be a token count >= 0, or one per prompt "
                         f"({n} prompts)")
    return [int(c) for c in values]


def requests_for(lengths: Sequence[int], chunk_size: Chunking, ids: Sequence[Hashable],
                 arrivals: Sequence[float] | None = None, cached: Sequence[int] | None = None) -> list[Request]:
    """The requests of a prefill: each prompt's chunk sizes (fixed, explicit or from a function) and
    arrival time. With ``cached`` prefixes the chunks cover the rest of each prompt: a chunking
    function is called as ``chunk_size(rest, cached=N)`` for a prompt with N > 0 cached tokens (a DCPP
    planner's ``chunk_sizes`` sizes the first chunk for that prefix), ``chunk_size(n)`` otherwise."""
    if arrivals is not None and (isinstance(arrivals, (str, bytes)) or not isinstance(arrivals, Sequence)):
        raise ValueError(f"arrivals must be one time in seconds per prompt, got {type(arrivals).__name__} {arrivals!r}")
    if arrivals is not None:  # numpy's float32 is a Real but not a float
        bad = [a for a in arrivals if isinstance(a, bool) or not isinstance(a, numbers.Real) or not 0 <= a < float("inf")]
        if bad:
            raise ValueError(f"arrivals must be finite seconds >= 0, got {_plain(bad[0])!r} in {_plain(list(arrivals))!r}")
    arrivals = [0.0] * len(lengths) if arrivals is None else [float(a) for a in arrivals]
    if len(arrivals) != len(lengths):
        raise ValueError(f"{len(arrivals)} arrival times for {len(lengths)} prompts")
    cached = [0] * len(lengths) if cached is None else list(cached)
    rest = [n - c for n, c in zip(lengths, cached)]
    if any(r < 1 for r in rest):
        raise ValueError(f"cached prefixes {cached} leave nothing to prefill of prompts of {list(lengths)} tokens")
    if isinstance(chunk_size, int):
        return [Request(q, r.chunk_sizes, a, c)
                for q, r, a, c in zip(ids, chunk_requests(rest, chunk_size), arrivals, cached)]
    if callable(chunk_size):
        chunk_size = [_called_chunking(chunk_size, n, c) for n, c in zip(rest, cached)]
    sizes = [tuple(s) for s in chunk_size]
    if len(sizes) != len(lengths):
        raise ValueError(f"{len(sizes)} chunkings for {len(lengths)} prompts")
    for q, n, s, c in zip(ids, rest, sizes, cached):
        if sum(s) != n:
            what = f"the {n} tokens after its {c} cached ones need covering" if c else f"the prompt has {n} tokens"
            raise ValueError(f"request {q}: chunk sizes sum to {sum(s)} but {what}")
    return [Request(q, s, a, c) for q, s, a, c in zip(ids, sizes, arrivals, cached)]


def _called_chunking(chunk_size, n: int, cached: int) -> list[int]:
    sizes = chunk_size(n, cached=cached) if cached else chunk_size(n)
    what = f"chunk sizes the chunking function gave for {n} tokens"
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise ValueError(f"{what} must be a sequence of positive integers, got {type(sizes).__name__} {sizes!r:.60}")
    return check_sizes(list(sizes), what)


__all__ = [
    "Chunking", "as_prompts", "cached_counts", "call_disagreement", "call_signature", "check_chunking",
    "check_request_ids", "check_sizes", "check_steps", "check_timeout", "is_count", "requests_for",
]
