"""Cost models for the simulator. A cost model has

* ``compute(stage, tokens, prefix) -> seconds`` -- one stage on a chunk of ``tokens`` tokens that attends
  to ``prefix`` cached tokens;
* ``transfer(tokens) -> seconds`` -- moving one chunk's activation between two ranks;
* optionally ``overhead(stage) -> seconds`` -- the part of ``compute`` paid once per stage step whatever
  its tokens (launches, per-step host work); a step shared by several requests pays it once, not once
  per piece (:func:`step_overhead`; 0 for a model without the method);
* optionally ``step_compute(stage, shapes) -> [seconds]`` -- the pieces of one step shared by requests
  (``shapes``: their (tokens, prefix), lead first), each piece's share of the step (:func:`piece_times`;
  without the method each piece is its own call, :func:`separate_calls`);
* ``overlap`` in [0, 1] -- how much of an async transfer can hide behind compute (the sender stalls for
  ``(1 - overlap)`` of it; blocking plans ignore it).

All three models below share the transfer model ``latency + tokens * seconds_per_token`` (use
:func:`seconds_per_token` to derive the slope from hidden size, dtype and bandwidth) and scale a stage's
compute by ``stage_weights[stage]`` (e.g. its layer count; default 1 for every stage).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence


class Cost(Protocol):
    overlap: float

    def compute(self, stage: int, tokens: int, prefix: int) -> float: ...

    def transfer(self, tokens: int) -> float: ...


def step_overhead(cost, stage: int) -> float:
    """``cost.overhead(stage)`` where the model states its per-step overhead, else 0."""
    overhead = getattr(type(cost), "overhead", None)
    return 0.0 if overhead is None else float(overhead(cost, stage))


def separate_calls(cost, stage: int, shapes) -> list[float]:
    """Seconds of each piece of one step on ``stage`` run as its own stage call (``shapes``: the pieces'
    (tokens, prefix), lead first): ``cost.compute`` of each, the per-step overhead paid once, by the lead."""
    return [float(cost.compute(stage, t, p)) - (step_overhead(cost, stage) if i else 0.0)
            for i, (t, p) in enumerate(shapes)]


def piece_times(cost, stage: int, shapes) -> list[float]:
    """Seconds of each piece of one step on ``stage`` (``shapes``: the pieces' (tokens, prefix), lead
    first): ``cost.step_compute(stage, shapes)`` where the model says how a step's pieces share its work
    (e.g. one batched forward, :mod:`vpp.perf.batched`), else :func:`separate_calls`."""
    step = getattr(type(cost), "step_compute", None)
    return separate_calls(cost, stage, shapes) if step is None else [float(t) for t in step(cost, stage, shapes)]


def seconds_per_token(hidden: int, *, bytes_per_value: int = 2, bandwidth: float = 3e9) -> float:
    """Transfer time per token of a ``hidden``-wide activation over a link of ``bandwidth`` bytes/s."""
    return hidden * bytes_per_value / bandwidth


@dataclass(frozen=True)
class _Comm:
    latency: float = 0.0
    seconds_per_token: float = 0.0
    overlap: float = 1.0
    stage_weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap={self.overlap} must lie in [0, 1]")
        if self.latency < 0 or self.seconds_per_token < 0:
            raise ValueError(f"latency={self.latency}, seconds_per_token={self.seconds_per_token} must be >= 0")

    def transfer(self, tokens: int) -> float:
        return self.latency + tokens * self.seconds_per_token

    def weight(self, stage: int) -> float:
        if self.stage_weights is None:
            return 1.0
        if stage >= len(self.stage_weights):
            raise ValueError(f"stage {stage} has no weight ({len(self.stage_weights)} stage_weights)")
        return self.stage_weights[stage]


@dataclass(frozen=True)
class LinearCost(_Comm):
    """``compute = w_s * (per_chunk + per_token * tokens + per_token_prefix * tokens * prefix
    + per_token_sq * tokens^2)``.

    The paper's Eq. 2, tau_k = (k + 1) t per stage for chunks of C tokens, is ``LinearCost.eq2(t, C)``:
    per_token = t / C and per_token_prefix = t / C^2 give t + t k for chunk k (prefix k C).
    ``per_token_sq`` (default 0) is attention within the chunk (causal: half of per_token_prefix), the
    term that makes one forward of l fresh tokens quadratic in l, as DCPP's profilers assume; tau_k
    stays linear in k."""

    per_chunk: float = 0.0
    per_token: float = 0.0
    per_token_prefix: float = 0.0
    per_token_sq: float = 0.0

    @classmethod
    def eq2(cls, t: float, chunk_size: int, **kw) -> "LinearCost":
        return cls(per_token=t / chunk_size, per_token_prefix=t / chunk_size ** 2, **kw)

    def overhead(self, stage: int) -> float:
        return self.weight(stage) * self.per_chunk

    def compute(self, stage: int, tokens: int, prefix: int) -> float:
        return self.weight(stage) * (self.per_chunk + self.per_token * tokens + self.per_token_prefix * tokens * prefix
                                     + self.per_token_sq * tokens * tokens)


@dataclass(frozen=True)
class TableCost(_Comm):
    """Measured times: ``table[(tokens, prefix)]`` for every stage, or ``per_stage[stage][(tokens, prefix)]``.
    Missing prefixes are interpolated (or extrapolated) linearly between the two nearest measured
    prefixes with the same token count; a token count never measured raises."""

    table: Mapping[tuple[int, int], float] = field(default_factory=dict)
    per_stage: Mapping[int, Mapping[tuple[int, int], float]] = field(default_factory=dict)

    @classmethod
    def from_chunk_times(cls, times: Sequence[Sequence[float]], chunk_sizes: Sequence[int], **kw) -> "TableCost":
        """``times[stage][k]``: measured time of stage ``stage`` on chunk ``k`` of a request cut into
        ``chunk_sizes``."""
        offsets = [sum(chunk_sizes[:k]) for k in range(len(chunk_sizes))]
        per_stage = {s: {(chunk_sizes[k], offsets[k]): float(t) for k, t in enumerate(row)}
                     for s, row in enumerate(times)}
        return cls(per_stage=per_stage, **kw)

    def compute(self, stage: int, tokens: int, prefix: int) -> float:
        table = self.per_stage.get(stage, self.table)
        if (tokens, prefix) in table:
            return self.weight(stage) * table[(tokens, prefix)]
        rows = sorted((p, t) for (n, p), t in table.items() if n == tokens)
        if not rows:
            have = sorted({n for n, _ in table})
            raise KeyError(f"no measurement for stage {stage} with tokens={tokens} (measured token counts {have})")
        if len(rows) == 1:
            return self.weight(stage) * rows[0][1]
        i = min(max(bisect.bisect_left([p for p, _ in rows], prefix), 1), len(rows) - 1)
        (p0, t0), (p1, t1) = rows[i - 1], rows[i]
        return self.weight(stage) * (t0 + (t1 - t0) * (prefix - p0) / (p1 - p0))


@dataclass(frozen=True)
class FlopCost(_Comm):
    """A FLOP model of one transformer layer, times layers per stage, plus a per-launch overhead:

    flops/layer = 2 * tokens * (4 h^2 + 3 h ffn + experts * 3 h moe_ffn) + 4 h tokens (prefix + (tokens + 1) / 2)

    (QKV/O projections, a SwiGLU MLP, ``experts`` active routed experts, causal attention scores and
    values), time = flops / flops_per_s + launches_per_layer * launch_overhead per layer. The paper-scale
    model from model configs (issue 7) plugs into the same protocol."""

    layers_per_stage: tuple[int, ...] = ()
    hidden: int = 4096
    ffn: int = 14336
    experts: int = 0
    moe_ffn: int = 0
    flops_per_s: float = 1e14
    launch_overhead: float = 2e-5
    launches_per_layer: int = 10

    @classmethod
    def for_layout(cls, layout, **kw) -> "FlopCost":
        kw.setdefault("seconds_per_token", seconds_per_token(kw.get("hidden", cls.hidden)))
        return cls(layers_per_stage=tuple(layout.partition), **kw)

    def layer_flops(self, tokens: int, prefix: int) -> float:
        h = self.hidden
        dense = 2 * tokens * (4 * h * h + 3 * h * self.ffn + self.experts * 3 * h * self.moe_ffn)
        return dense + 4 * h * tokens * (prefix + (tokens + 1) / 2)

    def overhead(self, stage: int) -> float:
        return self.compute(stage, 0, 0)

    def compute(self, stage: int, tokens: int, prefix: int) -> float:
        if stage >= len(self.layers_per_stage):
            raise ValueError(f"stage {stage} has no layer count ({len(self.layers_per_stage)} layers_per_stage)")
        per_layer = self.layer_flops(tokens, prefix) / self.flops_per_s + self.launches_per_layer * self.launch_overhead
        return self.weight(stage) * self.layers_per_stage[stage] * per_layer


__all__ = ["Cost", "FlopCost", "LinearCost", "TableCost", "piece_times", "seconds_per_token", "separate_calls",
           "step_overhead"]
