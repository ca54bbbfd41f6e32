"""The one exchange before a run: every rank learns what every other rank holds, so a mismatch is a
clear error on every rank instead of a hang in the middle of a plan.

Each global rank contributes a small descriptor (its stages' layer ranges and shapes, and, on the
pipeline ranks that hold stage 0, the prompts' lengths and any problem found in them); one
``all_gather_object`` over the world shares them. Every rank then runs the same checks on the same
data and so raises the same error.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist

from vpp.parallel.groups import ParallelGroups

from .watchdog import rendezvous


@dataclass(frozen=True)
class StageInfo:
    layer_range: tuple[int, int]
    hidden_size: int
    vocab_size: int
    is_first: bool
    is_last: bool
    dtype: str
    max_positions: int | None
    model: tuple[str, str] | None = None  # (digest, name) of the model the stage was loaded from, if known


@dataclass(frozen=True)
class RankInfo:
    global_rank: int
    pp_rank: int
    tp_rank: int
    stages: tuple[StageInfo, ...]
    prompt_lengths: tuple[int, ...] | None  # only where stage 0 lives
    prompt_problem: str | None
    plan_digest: str | None
    run_key: str


def describe_stage(stage: torch.nn.Module) -> StageInfo:
    """What the pipeline needs to know about a stage module (the stage contract of vpp.models)."""
    try:
        layer_range = tuple(int(x) for x in stage.layer_range)
        info = StageInfo(layer_range, int(stage.hidden_size), int(stage.vocab_size), bool(stage.is_first),
                         bool(stage.is_last), str(stage.dtype), getattr(stage, "max_positions", None),
                         model_of(stage))
    except AttributeError as exc:
        raise TypeError(f"{type(stage).__name__} does not follow the stage contract (layer_range, hidden_size, "
                        f"vocab_size, is_first, is_last, dtype): {exc}") from None
    return info


def model_of(stage: torch.nn.Module) -> tuple[str, str] | None:
    """``(digest, name)`` of the model a stage was loaded from (``stage.model_digest``, set by
    :func:`vpp.models.build_stage` from the config and the weights), or None."""
    digest = getattr(stage, "model_digest", None)
    return None if digest is None else (str(digest), str(getattr(stage, "model_name", "")))


def model_disagreement(infos: Sequence[RankInfo]) -> str | None:
    """Every rank's stages must come from one model (the digest of its config and weights, not its path):
    the problem, naming the ranks and the models, or None."""
    held = {}
    for info in infos:
        for st in info.stages:
            if st.model is not None:
                held.setdefault(st.model[0], (st.model[1], []))[1].append(info.global_rank)
    if len(held) <= 1:
        return None
    parts = [f"global rank(s) {sorted(set(ranks))} {name} (digest {digest})" for digest, (name, ranks) in held.items()]
    return "ranks loaded different models: " + " vs ".join(parts) + "; give every rank the same checkpoint"


def check_prompt(ids: torch.Tensor, stage: StageInfo, what: str = "prompt") -> str | None:
    """A readable problem with a prompt of token ids, or None."""
    if ids.dim() != 1:
        return f"{what} must be a 1-D tensor of token ids, got shape {tuple(ids.shape)}"
    if ids.numel() == 0:
        return f"{what} is empty"
    if ids.dtype not in (torch.int64, torch.int32):
        return f"{what} must hold integer token ids, got {ids.dtype}"
    lo, hi = int(ids.min()), int(ids.max())  # once per run, before it (a host read; not per chunk)
    if lo < 0 or hi >= stage.vocab_size:
        return f"{what} holds token ids in [{lo}, {hi}] outside the vocabulary [0, {stage.vocab_size})"
    if stage.max_positions is not None and ids.numel() > stage.max_positions:
        return f"{what} has {ids.numel()} tokens, more than the model's {stage.max_positions} positions"
    return None


def plan_digest(plan: Any) -> str:
    return hashlib.sha1(plan.to_json().encode()).hexdigest()[:16]


def exchange(
    stages: Sequence[torch.nn.Module],
    groups: ParallelGroups,
    prompts: Sequence[torch.Tensor] | None,
    *,
    plan: Any = None,
    problem: str | None = None,
    timeout_s: float = 300.0,
) -> list[RankInfo]:
    """Share every rank's :class:`RankInfo` over this instance's ranks (the world unless the groups
    say otherwise, ``groups.members``); returns them in the members' order. ``problem``: an input
    problem this rank found before (raised on every rank after the exchange). A rank that does not
    reach the exchange within ``timeout_s`` is named in an ExecutionError on the others."""
    infos = tuple(describe_stage(s) for s in stages)
    lengths = None
    if prompts is not None:
        first = next((i for i in infos if i.is_first), None)
        if first is not None:
            lengths = tuple(int(p.numel()) for p in prompts)
            problems = [check_prompt(p, first, f"prompt {i}" if len(prompts) > 1 else "prompt")
                        for i, p in enumerate(prompts)]
            problem = problem or next((p for p in problems if p), None) or (None if prompts else "no prompts given")
    mine = RankInfo(groups.global_rank, groups.pp.rank, groups.tp.rank, infos, lengths, problem,
                    plan_digest(plan) if plan is not None else None, os.urandom(8).hex())
    if not dist.is_initialized() or groups.sizes.world_size == 1:
        return [mine]
    members = groups.members
    rendezvous("the start-up exchange", groups.global_rank, members, timeout_s=timeout_s)
    out: list[Any] = [None] * len(members)
    dist.all_gather_object(out, mine, group=groups.instance_pg)
    return out


def prompts_digest(prompts: Sequence[torch.Tensor]) -> str:
    """A short hash of the prompts' token ids (their count, each one's length and values): ranks given
    the prompts compare it in the prompts' exchange. One pass over the ids (about 8 MB for 1M tokens)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(str(len(prompts)).encode())
    for p in prompts:
        ids = p.detach().reshape(-1).to("cpu", torch.int64).contiguous()
        h.update(f"/{ids.numel()}:".encode())
        h.update(ids.numpy().tobytes())
    return h.hexdigest()


def disagreement(infos) -> str | None:
    """Ranks given prompts (any rank may be) must have been given the same ones: the problem, naming the
    ranks and what differs, or None. ``infos`` carry ``global_rank``, ``prompt_digest`` and, on ranks
    holding stage 0, ``prompt_lengths``."""
    given = [i for i in infos if getattr(i, "prompt_digest", None) is not None]
    digests = sorted({i.prompt_digest for i in given})
    if len(digests) <= 1:
        return None
    groups = {d: [i.global_rank for i in given if i.prompt_digest == d] for d in digests}
    groups = sorted(groups.values())
    lengths = {i.global_rank: i.prompt_lengths for i in given if i.prompt_lengths is not None}
    parts = []
    for ranks in groups:
        lens = next((lengths[r] for r in ranks if r in lengths), None)
        parts.append(f"global rank(s) {ranks}" + (f" (lengths {list(lens)})" if lens is not None else ""))
    return ("ranks were given different prompts: " + " vs ".join(parts)
            + "; give every rank the same prompts, or None on the ranks that do not hold stage 0")


def pipeline_of(infos: list[RankInfo], groups: ParallelGroups) -> list[RankInfo]:
    """The descriptors of this rank's pipeline, indexed by pipeline rank."""
    if len(infos) == 1:
        return [infos[0] for _ in groups.pp.ranks]
    by_rank = {i.global_rank: i for i in infos}
    return [by_rank[g] for g in groups.pp.ranks]


def order_problem(pipeline: list[RankInfo], layout) -> str | None:
    """Each pipeline rank must list its stage modules in the layout's stage order (the order of their
    layer ranges): the pipeline pairs the modules with the layout's stages by position, so another order
    would run each chunk through the wrong layers. The problem, naming the ranks, or None (the same on
    every rank: every rank holds every rank's descriptor)."""
    wrong = {}
    for r, info in enumerate(pipeline):
        given = [list(st.layer_range) for st in info.stages]
        expected = [list(layout.stage_layers[s]) for s in layout.stages_of(r)]
        if given != expected:
            wrong[r] = (given, expected)
    if not wrong:
        return None
    r, (given, expected) = next(iter(wrong.items()))
    return (f"pipeline rank(s) {sorted(wrong)} list their stage modules out of stage order: pipeline rank {r} "
            f"gives layer ranges {given}, the layout's stages on it are {expected}; pass each rank's stages "
            f"in that order")


def first_problem(infos: list[RankInfo]) -> str | None:
    """The first prompt problem any rank found (so every rank raises the same one)."""
    return next((i.prompt_problem for i in infos if i.prompt_problem), None)


def prompt_lengths(infos: list[RankInfo]) -> tuple[int, ...]:
    found = {i.prompt_lengths for i in infos if i.prompt_lengths is not None}
    if not found:
        raise ValueError("no rank that holds stage 0 was given the prompt token ids")
    if len(found) > 1:
        raise ValueError(f"ranks holding stage 0 were given different prompts (lengths {sorted(found)})")
    return found.pop()


__all__ = [
    "RankInfo", "StageInfo", "check_prompt", "describe_stage", "disagreement", "exchange", "first_problem",
    "model_disagreement", "model_of", "order_problem",
    "pipeline_of", "plan_digest", "prompt_lengths", "prompts_digest",
]
