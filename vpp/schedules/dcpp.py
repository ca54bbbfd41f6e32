"""DCPP chunk planners: chunk sizes that shrink as the prefix grows, so each chunk takes about as long
as the first one (dynamic chunked-prefill pipeline parallelism, the paper's baseline).

Every mode models the time of one forward over ``l`` fresh tokens as ``f(l) = a l^2 + b l + c``, fitted
by least squares to profiled single forwards, and sets a target ``T`` (first ``f(B) - f(0)`` for the
token budget ``B``). For a request with ``L`` tokens done the next chunk ``x*`` solves
``f(L + x) - f(L) = T``; it is smoothed towards the budget, ``x_s = B + s (x* - B)``, floored, aligned to
``max(page, 64)`` and capped. Each mode reproduces one engine's planner exactly (same chunk list for
the same measured times; ``tests/schedules/test_dcpp_peers.py`` carries the transcribed formulas):

==================  ============================  ============================  ============================
                    ``vllm-ascend`` (main)         ``vllm-ascend-7896``           ``sglang``
==================  ============================  ============================  ============================
commit              vllm-ascend 182b75ea (incl.    vllm-ascend bec63146 (merge   sglang 00ff98d3
                    #10746, 047db47f)              of PR #7896)
profiled sizes      ``int(B - (i-1) B/64)``,       as main                       ``int(1.25B - i (1.25B //
                    i = 0..64, i = 0 a warm-up                                   128))``, i = 0..127, the
                                                                                 first dropped
profiled rank       the output (last) rank         as main                       the first rank
fit clamps          none                           a < 0 -> 1e-9, b < 0 -> 1e-9  a <= 0 raises, b < 0 -> 0
                                                   (ms units, also the history
                                                   fit)
smoothing ``s``     1.0                            0.8                           0.75
``min_chunk``       4096, clamped to B when B is   4096                          B // 4
                    smaller
rounding            up to the alignment            up                            down, then capped by
                                                                                 ``max_prefill_tokens`` and
                                                                                 ``context_len - L - 100``
first chunk         predicted (at the cached       never predicted               never predicted (the budget)
                    prefix) once timing is off;
                    the budget while it is on
online timing       ``need_timing`` (default on):  always on: target reset to    none
                    target reset to the measured   the first first-chunk step's
                    time of the first 3 steps      time; history fit as main,
                    with no prefix (so the fit's   timing never off
                    constant cancels); history
                    model ``a C(C+H) + b(C+H) +
                    c`` fitted over steps 5..30
                    (``max_fit_chunk``); timing
                    switched off after both
==================  ============================  ============================  ============================

Every mode caps a chunk by the budget and the tokens left. The paper's baseline is vLLM-Ascend's DCPP,
so ``vllm-ascend`` (main) is the default everywhere. Times are milliseconds inside the planner (both
engines fit in ms, so the unit-bound constants -- vLLM-Ascend's 1 ms fallback target, #7896's 1e-9
clamps -- apply as written); ``measure`` and :meth:`DcppPlanner.observe` take seconds.

A prompt whose first ``cached`` tokens are already in the caches is chunked from there
(``chunk_sizes(rest, cached=N)``): the first chunk is sized for that prefix where the engine does so.
``merge_tail`` (every planner, also :func:`vpp.schedules.ir.chunk_requests`) joins a final chunk smaller
than the threshold to the one before. :func:`dcpp_requests` turns chunk lists into ordinary
:class:`~vpp.schedules.ir.Request` objects for :func:`~vpp.schedules.builders.build_cpp`; :func:`plan_online`
plans a stream chunk by chunk while feeding the planner each step's time (the engines' online mode).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from .ir import Request

VARIANTS = ("vllm-ascend", "vllm-ascend-7896", "sglang")
DEFAULT_VARIANT = "vllm-ascend"
DEFAULT_SMOOTHING = {"vllm-ascend": 1.0, "vllm-ascend-7896": 0.8, "sglang": 0.75}
MIN_FIT_POINTS = 8                     # both engines refuse to fit fewer profiled points
REFIT_MIN = 5                          # vLLM-Ascend's MIN_FIT_POINTS_CHUNK
MAX_FIT_CHUNK = 30                     # vLLM-Ascend's max_fit_chunk (#7896: MAX_FIT_POINTS_CHUNK)
TARGET_SAMPLES = {"vllm-ascend": 3, "vllm-ascend-7896": 1}   # first-chunk steps that reset the target
_CLAMP_7896 = 1e-9                     # #7896: a < 0 -> 1e-9, b < 0 -> 1e-9 (ms units)
_T_FALLBACK_MS = 1.0                   # vLLM-Ascend: target <= 0 -> 1 ms


def fit_quadratic(sizes: Sequence[float], times: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares ``(a, b, c)`` of ``times ~ a l^2 + b l + c`` over ``sizes``."""
    x = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(times, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"sizes and times must be two equal-length lists, got {len(x)} and {len(y)}")
    if len(set(x.tolist())) < 3:
        raise ValueError(f"a quadratic fit needs at least 3 distinct sizes, got {sorted(set(x.tolist()))}")
    design = np.column_stack([x * x, x, np.ones_like(x)])
    (a, b, c), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(a), float(b), float(c)


def profile_sizes(variant: str, budget: int) -> list[int]:
    """The chunk sizes a mode times at start-up, warm-up first (see the module docstring)."""
    _check_variant(variant)
    if variant == "sglang":
        step = (budget * 1.25) // 128
        sizes = [int(budget * 1.25 - i * step) for i in range(128)]
    else:
        sizes = [int(budget - (i - 1) * (budget / 64)) for i in range(65)]
    out = []
    for s in sizes:        # both engines stop at the first size <= 0
        if s <= 0:
            break
        out.append(s)
    return out


def profiled_rank(variant: str, num_ranks: int) -> int:
    """The pipeline rank whose stages a mode profiles: vLLM-Ascend's output rank (its
    ``unique_reply_rank`` is the last PP rank), SGLang's first rank. The runtime
    (:func:`vpp.runtime.dcpp_profile.profile_planner`) and the simulator (:func:`profiled_stages`) both use this."""
    _check_variant(variant)
    return 0 if variant == "sglang" else num_ranks - 1


def profiled_stages(layout, variant: str) -> list[int]:
    """The stages of :func:`profiled_rank` on ``layout``."""
    return layout.stages_of(profiled_rank(variant, layout.num_ranks))


def stage_measure(cost, stages: Iterable[int]) -> Callable[[int], float]:
    """``measure(tokens)``: the simulated time of ``stages`` (run back to back) on a fresh chunk."""
    stages = tuple(stages)
    return lambda tokens: sum(float(cost.compute(s, tokens, 0)) for s in stages)


@dataclass
class DcppPlanner:
    """A DCPP chunk planner in one of :data:`VARIANTS` (modes; see the module docstring).

    ``planner.profile(measure)`` (or ``fit(sizes, seconds)``) sets the model; ``chunk_sizes(n, cached=N)``
    cuts a prompt of ``n`` tokens to prefill after ``N`` cached ones; ``next_chunk`` decides one chunk;
    ``observe`` / ``observe_step`` feed measured step times (vLLM-Ascend's online calibration, on while
    ``timing``). ``align`` is the KV page size (chunks align to ``max(align, 64)``); ``max_chunk`` and
    ``context_len`` are SGLang's ``max_prefill_tokens`` and model context length; ``merge_tail`` joins
    a final chunk below that many tokens to the one before (0: off).

    A step shared by several requests (vLLM-Ascend #9900's time budget): start from ``planner.target``
    (ms), plan the first request's chunk, subtract ``planner.time(chunk, prefix) * 1000``, and pass what
    is left as ``next_chunk(..., time_budget_ms=left)`` for the next request (the engine stops adding
    requests once it is <= 0)."""

    variant: str = DEFAULT_VARIANT
    budget: int = 8192
    smoothing: float | None = None
    min_chunk: int | None = None
    align: int = 64
    max_chunk: int | None = None
    context_len: int | None = None
    online: bool = True
    max_fit_chunk: int = MAX_FIT_CHUNK
    merge_tail: int = 0
    a: float = field(default=0.0, init=False)
    b: float = field(default=0.0, init=False)
    c: float = field(default=0.0, init=False)
    target: float | None = field(default=None, init=False)          # ms
    history: list = field(default_factory=list, init=False, repr=False)
    history_coef: tuple[float, float, float] | None = field(default=None, init=False)
    history_fitted: bool = field(default=False, init=False)
    timing: bool = field(default=False, init=False)
    target_samples: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        _check_variant(self.variant)
        if self.budget < 1:
            raise ValueError(f"budget={self.budget} tokens must be >= 1")
        if self.smoothing is None:
            self.smoothing = DEFAULT_SMOOTHING[self.variant]
        if not 0.0 <= self.smoothing <= 1.0:
            raise ValueError(f"smoothing={self.smoothing} must lie in [0, 1]")
        self.align = max(int(self.align), 64)
        if self.min_chunk is None:
            self.min_chunk = self.budget // 4 if self.variant == "sglang" else 4096
            if self.variant == "vllm-ascend":          # ascend_config: clamp min_chunk to max_num_batched_tokens
                self.min_chunk = min(self.min_chunk, self.budget)
        if self.max_chunk is None:
            self.max_chunk = self.budget
        if self.merge_tail < 0:
            raise ValueError(f"merge_tail={self.merge_tail} must be >= 0 tokens")
        if self.variant == "sglang":
            self.online = False
        self.timing = bool(self.online) or self.variant == "vllm-ascend-7896"

    # -- model ---------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.target is not None

    def profile(self, measure: Callable[[int], float]) -> "DcppPlanner":
        """Time ``measure(size)`` (seconds) at the mode's profile sizes (the first is a warm-up), then fit."""
        sizes = profile_sizes(self.variant, self.budget)
        times = [float(measure(n)) for n in sizes]
        return self.fit(sizes[1:], times[1:])

    def fit(self, sizes: Sequence[int], times: Sequence[float]) -> "DcppPlanner":
        """Fit ``f`` to measured (size, seconds) pairs and set the target ``T = f(B) - f(0)``."""
        if len(sizes) < MIN_FIT_POINTS:
            raise ValueError(f"{len(sizes)} profiled points; both engines need at least {MIN_FIT_POINTS}")
        a, b, c = fit_quadratic(sizes, [t * 1000.0 for t in times])
        if self.variant == "sglang":
            if a <= 0:
                raise ValueError(f"fitted a={a:.3e} ms/token^2 is not positive (SGLang refuses such a fit): "
                                 f"attention should make the profiled times grow quadratically")
            b = max(b, 0.0)
        elif self.variant == "vllm-ascend-7896":
            a, b = _clamp_7896(a, b)
        self.a, self.b, self.c = a, b, c
        f = lambda n: self.a * n * n + self.b * n + self.c
        target = f(float(self.budget)) - f(0.0)
        if target <= 0:
            if self.variant == "sglang":
                raise ValueError(f"target f(B) - f(0) = {target:.3e} ms is not positive (B={self.budget})")
            target = _T_FALLBACK_MS
        self.target = target
        return self

    def time(self, tokens: int, prefix: int) -> float:
        """Model time (seconds) of a chunk of ``tokens`` after ``prefix``, as the engine predicts it."""
        if self.history_coef is not None:
            ha, hb, hc = self.history_coef
            return (ha * tokens * (tokens + prefix) + hb * (tokens + prefix) + hc) / 1000.0
        f = lambda n: self.a * n * n + self.b * n + self.c
        return (f(tokens + prefix) - f(prefix)) / 1000.0

    def predict(self, prefix: int, time_budget_ms: float | None = None) -> int | None:
        """The engine's predicted (smoothed, floored, aligned) chunk at ``prefix``, or None where it
        has none. ``time_budget_ms``: vLLM-Ascend's remaining time budget of a step (default the target)."""
        if not self.ready:
            return None
        target = self.target
        if time_budget_ms is not None and time_budget_ms > 0:
            target = time_budget_ms
            if self.variant == "vllm-ascend-7896":      # #7896 overwrites the target with the step's budget
                self.target = target
        strict = self.variant != "vllm-ascend"          # a <= 0 -> None (main: only a == 0)
        if self.history_coef is not None:
            ha, hb, hc = self.history_coef
            qa, qb, qc = ha, ha * prefix + hb, hb * prefix + hc - target
        else:
            qa, qb, qc = self.a, 2 * self.a * prefix + self.b, -target
        if qa == 0 or (strict and qa < 0):
            return None
        disc = qb * qb - 4 * qa * qc
        if disc < 0:
            return None
        x = (-qb + math.sqrt(disc)) / (2 * qa)
        if x <= 0:
            return None
        smoothed = self.budget + self.smoothing * (x - self.budget)
        n = max(int(smoothed), self.min_chunk)
        al = self.align
        if self.variant != "sglang":
            n = ((n + al - 1) // al) * al
            return max(n, al)
        n = max((n // al) * al, al)
        allowed = self.max_chunk
        if self.context_len is not None:
            allowed = min(allowed, self.context_len - prefix - 100)
        n = (min(n, allowed) // al) * al
        return n if n >= al else None

    # -- chunking ------------------------------------------------------------------------------------
    def next_chunk(self, prefix: int, remaining: int, *, first: bool | None = None,
                   time_budget_ms: float | None = None) -> int:
        """Tokens of the next chunk of a request with ``prefix`` tokens in the caches and ``remaining``
        left; ``first``: the request's first scheduled chunk (default: ``prefix == 0``; pass True for
        a prompt with a cached prefix)."""
        if remaining < 1:
            raise ValueError(f"remaining={remaining}: nothing left to chunk")
        first = prefix == 0 if first is None else first
        if self.variant == "sglang":                    # only a continuing chunked request is predicted
            limit = None if first else self.predict(prefix)
            return self._merged(min(limit if limit is not None else self.budget, remaining), remaining)
        if self.variant == "vllm-ascend-7896":
            allowed = not first and min(remaining, self.budget) > 1
        else:
            allowed = not first or not self.timing
        n = remaining
        pred = self.predict(prefix, time_budget_ms) if allowed else None
        if pred is not None and pred > 0:
            n = min(pred, n)
        return self._merged(min(n, self.budget), remaining)

    def _merged(self, n: int, remaining: int) -> int:
        """``merge_tail``: take the rest now when it would leave a final chunk below the threshold."""
        return remaining if 0 < remaining - n < self.merge_tail else n

    def chunk_sizes(self, length: int, *, cached: int = 0) -> list[int]:
        """Cut ``length`` tokens to prefill after ``cached`` tokens already in the caches (no
        observations: the planner's current state decides every chunk)."""
        if length < 1:
            raise ValueError(f"length={length}: a prompt needs at least one token to prefill")
        if cached < 0:
            raise ValueError(f"cached={cached} tokens must be >= 0")
        out, done = [], 0
        while done < length:
            n = self.next_chunk(cached + done, length - done, first=not out)
            out.append(n)
            done += n
        return out

    # -- online calibration (vLLM-Ascend) ------------------------------------------------------------
    def observe(self, tokens: int, prefix: int, seconds: float) -> bool:
        """One step of one request chunk measured (see :meth:`observe_step`)."""
        return self.observe_step([(tokens, prefix)], seconds)

    def observe_step(self, chunks: Sequence[tuple[int, int]], seconds: float) -> bool:
        """Record one step that ran ``chunks`` ((tokens, prefix) per request) in ``seconds``, as
        vLLM-Ascend's ``_record_execution_timing`` does; returns True when the history model was
        (re-)fitted. The target is reset to the step's time while no prefix was present (main: the
        first 3 such steps, #7896: the first); main switches ``timing`` off once the target is set and
        the history window (``max_fit_chunk`` steps) is full. SGLang: a no-op returning False."""
        if self.variant == "sglang" or not self.ready:
            return False
        main = self.variant == "vllm-ascend"
        if main:
            if not self.timing:
                return False
            if self.target_samples >= TARGET_SAMPLES[self.variant] and self.history_fitted:
                self.timing = False
                return False
        ms = float(seconds) * 1000.0
        if ms <= 0:
            return False
        chunks = [(int(c), int(h)) for c, h in chunks if c > 0]
        if sum(h for _, h in chunks) == 0 and self.target_samples < TARGET_SAMPLES[self.variant]:
            self.target = ms
            self.target_samples += 1
        if not chunks:
            if main:
                return False
            chunks = [(0, 0)]                       # #7896 records (total tokens, 0): unreachable here
        if self.history_fitted:
            return False
        x1 = sum((c + h) * c for c, h in chunks)
        x2 = sum(c + h for c, h in chunks)
        self.history.append([x1, x2, len(chunks), ms])
        return self._fit_history()

    def _fit_history(self) -> bool:
        n = len(self.history)
        if n < REFIT_MIN:
            return False
        if n > self.max_fit_chunk:
            self.history_fitted = True
            return False
        data = np.asarray(self.history, dtype=np.float64)
        (ha, hb, hc), *_ = np.linalg.lstsq(data[:, :-1], data[:, -1], rcond=None)
        ha, hb, hc = float(ha), float(hb), float(hc)
        if self.variant == "vllm-ascend-7896":
            ha, hb = _clamp_7896(ha, hb)
        self.history_coef = (ha, hb, hc)
        return True


def plan_online(planner: DcppPlanner, lengths: Iterable[int], step_seconds: Callable[[int, int], float], *,
                cached: Iterable[int] | None = None) -> list[list[int]]:
    """Chunk lists of a stream of prompts run one after another, chunk by chunk, with
    ``planner.observe(tokens, prefix, step_seconds(tokens, prefix))`` after each (one planner for the
    whole stream, as one engine keeps one). ``lengths`` are the tokens to prefill, ``cached`` their
    cached prefixes."""
    lengths = list(lengths)
    cached = [0] * len(lengths) if cached is None else list(cached)
    out = []
    for n, h in zip(lengths, cached):
        done, sizes = 0, []
        while done < n:
            c = planner.next_chunk(h + done, n - done, first=not sizes)
            planner.observe(c, h + done, step_seconds(c, h + done))
            sizes.append(c)
            done += c
        out.append(sizes)
    return out


def dcpp_requests(lengths: Iterable[int], planner: DcppPlanner, *, first_id: int = 0,
                  cached: Iterable[int] | None = None) -> list[Request]:
    """Requests of the given prompt lengths (tokens to prefill) cut by ``planner`` (feed them to
    ``build_cpp``); ``cached``: each prompt's cached prefix."""
    lengths = list(lengths)
    cached = [0] * len(lengths) if cached is None else list(cached)
    return [Request(first_id + i, tuple(planner.chunk_sizes(n, cached=h)), cached=h)
            for i, (n, h) in enumerate(zip(lengths, cached))]


def _clamp_7896(a: float, b: float) -> tuple[float, float]:
    return (_CLAMP_7896 if a < 0 else a), (_CLAMP_7896 if b < 0 else b)


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown DCPP mode {variant!r}; choose one of {VARIANTS}")


__all__ = [
    "DEFAULT_SMOOTHING", "DEFAULT_VARIANT", "DcppPlanner", "MAX_FIT_CHUNK", "MIN_FIT_POINTS", "REFIT_MIN",
    "TARGET_SAMPLES", "VARIANTS", "dcpp_requests", "fit_quadratic", "plan_online", "profile_sizes",
    "profiled_rank", "profiled_stages", "stage_measure",
]
