"""DCPP chunk planners: chunk sizes that shrink as the prefix grows, so each chunk takes about as long
as the first one (dynamic chunked-prefill pipeline parallelism, the paper's baseline).

Both published algorithms model the time of one forward over ``l`` fresh tokens as a quadratic,
``f(l) = a l^2 + b l + c``, fitted by least squares to profiled single forwards, and set the target
``T = f(B) - f(0)`` for the token budget ``B``. For a request with ``L`` tokens done, the next chunk
``x*`` solves ``f(L + x) - f(L) = T``, i.e. ``a x^2 + (2aL + b) x = T``; it is then smoothed towards the
budget, ``x_s = B + s (x* - B)``, floored, aligned and capped:

=====================  ===========================================  ==========================================
                       ``"vllm-ascend"`` ("profiling chunk")         ``"sglang"`` (dynamic chunking)
=====================  ===========================================  ==========================================
profiled sizes         ``int(B - (i-1) B/64)``, i = 0..64: i = 0      ``int(1.25B - i (1.25B // 128))``,
                       (B + B/64) is a discarded warm-up, then        i = 0..127; the first is dropped from the
                       B, 63B/64, ..., B/64 (64 points)               fit (its run is a cold warm-up)
profiled stage         one rank's stage (the reply of the output      the first pipeline rank's stage
                       rank, ``_build_rpc_kwargs``; its design doc
                       says the first rank)
smoothing ``s``        1.0 (``ProfilingChunkConfig.smooth_factor``)   0.75 (``SGLANG_DYNAMIC_CHUNKING_SMOOTH_
                                                                      FACTOR``)
floor                  ``min_chunk`` = 4096, on ``int(x_s)``          ``B // 4``, on ``int(x_s)``
alignment              up to a multiple of max(page, 64)              down to a multiple of max(page, 64)
cap                    the token budget B and the tokens left          ``max_prefill_tokens`` (here ``max_chunk``,
                                                                      default B) and the tokens left
bad fit                a < 0 -> 1e-9 ms/token^2, b < 0 -> 0           a <= 0 raises; b < 0 -> 0
online re-fit          ``f(C, H) = a C (C+H) + b (C+H) + c`` by least  none
                       squares over 5..30 observed batches, then used
                       for every later chunk with H > 0
=====================  ===========================================  ==========================================

Sources read: vllm-project/vllm-ascend ``vllm_ascend/core/profiling_chunk_predictor.py``,
``scheduler_profiling_chunk.py``, ``ascend_config.py`` and
``docs/.../Design_Documents/dynamic_chunked_pipeline_parallel.md``; sgl-project/sglang
``python/sglang/srt/managers/scheduler_pp_mixin.py`` (``ChunkSizePredictor``,
``profile_and_init_predictor``) and ``environ.py``. Where they differ from the issue's text:

* SGLang does not profile ``B .. B/64``: it profiles 128 sizes from 1.25 B down in steps of 1.25B // 128
  and drops the first. vLLM-Ascend matches the text (its warm-up is at B + B/64).
* vLLM-Ascend's design doc says "round down"; its code rounds up. We follow the code (as the text does).
* Both give the first chunk of a request the full budget: vLLM-Ascend only predicts once tokens are
  computed (with online timing on, its default), SGLang only for a continuing chunked request. We do the
  same, which also keeps float noise in ``x*(0) = B`` from turning the first chunk into B - 64.
* ``min_chunk`` default: vLLM-Ascend's 4096, capped at ``B // 2`` so that the budgets of the tiny CPU
  models (a few hundred tokens) keep room to shrink; at every paper budget (8K..32K) it is 4096.
* Times are seconds here (both sources use milliseconds); the unit-bound constants (vLLM-Ascend's
  1e-9 floor on ``a`` and 1 ms fallback target) are converted.

The planner only decides chunk sizes; :func:`dcpp_requests` turns them into ordinary
:class:`~vpp.plan.ir.Request` objects for :func:`~vpp.plan.builders.build_cpp`, so the verifier,
simulator, executor and traces apply unchanged. Profiling is a callable ``measure(tokens) -> seconds``
(one forward of ``tokens`` fresh tokens): the executor times a real stage; :func:`stage_measure` builds
one from a simulator cost model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from .ir import Request

VARIANTS = ("vllm-ascend", "sglang")
DEFAULT_SMOOTHING = {"vllm-ascend": 1.0, "sglang": 0.75}
MIN_FIT_POINTS = 8                     # both sources refuse to fit fewer profiled points
REFIT_MIN, REFIT_MAX = 5, 30           # vLLM-Ascend online re-fit window (MIN/MAX_FIT_POINTS_CHUNK)
_A_FLOOR = 1e-9 * 1e-3                 # vLLM-Ascend: a < 0 -> 1e-9 ms/token^2, in s/token^2
_T_FALLBACK = 1e-3                     # vLLM-Ascend: target <= 0 -> 1 ms


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
    """The chunk sizes a variant times at start-up, warm-up first (see the module docstring)."""
    _check_variant(variant)
    if variant == "vllm-ascend":
        sizes = [int(budget - (i - 1) * (budget / 64)) for i in range(65)]
    else:
        step = (budget * 1.25) // 128
        sizes = [int(budget * 1.25 - i * step) for i in range(128)]
    return [s for s in sizes if s > 0]


def stage_measure(cost, stages: Iterable[int]) -> Callable[[int], float]:
    """``measure(tokens)``: the simulated time of ``stages`` (run back to back) on a fresh chunk."""
    stages = tuple(stages)
    return lambda tokens: sum(float(cost.compute(s, tokens, 0)) for s in stages)


def profiled_stages(layout, variant: str) -> list[int]:
    """The stages a variant's profiler times: the last rank's (vLLM-Ascend) or the first rank's (SGLang)."""
    _check_variant(variant)
    rank = layout.num_ranks - 1 if variant == "vllm-ascend" else 0
    return layout.stages_of(rank)


@dataclass
class DcppPlanner:
    """A DCPP chunk planner (see the module docstring for the two variants).

    ``planner.profile(measure)`` (or ``planner.fit(sizes, times)``) sets the model; then
    ``planner.chunk_sizes(length)`` cuts a prompt, and ``planner.observe(tokens, prefix, seconds)`` feeds
    the optional online re-fit (vLLM-Ascend only)."""

    variant: str = "vllm-ascend"
    budget: int = 8192
    smoothing: float | None = None
    min_chunk: int | None = None
    align: int = 64
    max_chunk: int | None = None
    a: float = field(default=0.0, init=False)
    b: float = field(default=0.0, init=False)
    c: float = field(default=0.0, init=False)
    target: float | None = field(default=None, init=False)
    history: list = field(default_factory=list, init=False, repr=False)
    history_coef: tuple[float, float, float] | None = field(default=None, init=False)

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
            self.min_chunk = min(4096, self.budget // 2) if self.variant == "vllm-ascend" else self.budget // 4
        if self.max_chunk is None:
            self.max_chunk = self.budget

    # -- model ---------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.target is not None

    def profile(self, measure: Callable[[int], float]) -> "DcppPlanner":
        """Time ``measure(size)`` at the variant's profile sizes (the first is a warm-up), then fit."""
        sizes = profile_sizes(self.variant, self.budget)
        times = [float(measure(n)) for n in sizes]
        return self.fit(sizes[1:], times[1:])

    def fit(self, sizes: Sequence[int], times: Sequence[float]) -> "DcppPlanner":
        """Fit ``f`` to measured (size, seconds) pairs and set the target ``T = f(B) - f(0)``."""
        if len(sizes) < MIN_FIT_POINTS:
            raise ValueError(f"{len(sizes)} profiled points; both sources need at least {MIN_FIT_POINTS}")
        a, b, c = fit_quadratic(sizes, times)
        if self.variant == "sglang" and a <= 0:
            raise ValueError(f"fitted a={a:.3e} s/token^2 is not positive (SGLang refuses such a fit): "
                             f"attention should make the profiled times grow quadratically")
        a = max(a, _A_FLOOR) if self.variant == "vllm-ascend" else a
        self.a, self.b, self.c = a, max(b, 0.0), c
        target = self.a * self.budget ** 2 + self.b * self.budget
        if target <= 0:
            if self.variant == "sglang":
                raise ValueError(f"target f(B) - f(0) = {target:.3e} s is not positive (B={self.budget})")
            target = _T_FALLBACK
        self.target = target
        return self

    def time(self, tokens: int, prefix: int) -> float:
        """Model time of a chunk of ``tokens`` after ``prefix`` (f(L + x) - f(L), or the re-fitted model)."""
        if self.history_coef is not None and prefix > 0:
            ha, hb, hc = self.history_coef
            return ha * tokens * (tokens + prefix) + hb * (tokens + prefix) + hc
        f = lambda n: self.a * n * n + self.b * n + self.c
        return f(tokens + prefix) - f(prefix)

    def ideal_size(self, prefix: int) -> float | None:
        """``x*``: the (real-valued) chunk whose model time at ``prefix`` equals the target."""
        if not self.ready:
            return None
        if self.history_coef is not None and prefix > 0:
            ha, hb, hc = self.history_coef
            qa, qb, qc = ha, ha * prefix + hb, hb * prefix + hc - self.target
        else:
            qa, qb, qc = self.a, 2 * self.a * prefix + self.b, -self.target
        if qa <= 0:
            return None
        disc = qb * qb - 4 * qa * qc
        if disc < 0:
            return None
        x = (-qb + math.sqrt(disc)) / (2 * qa)
        return x if x > 0 else None

    # -- chunking ------------------------------------------------------------------------------------
    def next_chunk(self, prefix: int, remaining: int) -> int:
        """Tokens of the next chunk of a request with ``prefix`` tokens done and ``remaining`` left."""
        if remaining < 1:
            raise ValueError(f"remaining={remaining}: nothing left to chunk")
        fixed = min(self.budget, remaining)
        x = self.ideal_size(prefix) if prefix > 0 else None
        if x is None:
            return fixed
        smoothed = self.budget + self.smoothing * (x - self.budget)
        al = self.align
        if self.variant == "vllm-ascend":
            n = max(int(smoothed), self.min_chunk)
            n = max(-(-n // al) * al, al)
            return min(n, self.budget, remaining)
        n = max(int(smoothed), self.min_chunk)
        n = max((n // al) * al, al)
        n = (min(n, self.max_chunk) // al) * al
        if n < al:
            return fixed
        return min(n, remaining)

    def chunk_sizes(self, length: int) -> list[int]:
        """Cut a prompt of ``length`` tokens into chunks."""
        if length < 1:
            raise ValueError(f"length={length}: a prompt needs at least one token")
        out, done = [], 0
        while done < length:
            n = self.next_chunk(done, length - done)
            out.append(n)
            done += n
        return out

    # -- online re-fit (vLLM-Ascend) -----------------------------------------------------------------
    def observe(self, tokens: int, prefix: int, seconds: float) -> bool:
        """Record one measured chunk; returns True when the history model was (re-)fitted.

        vLLM-Ascend fits ``f(C, H) = a C (C + H) + b (C + H) + c`` once 5 batches are recorded and keeps
        re-fitting until 30 (then freezes). SGLang has no online re-fit: a no-op returning False."""
        if self.variant != "vllm-ascend":
            return False
        self.history.append((tokens * (tokens + prefix), tokens + prefix, 1.0, float(seconds)))
        n = len(self.history)
        if n < REFIT_MIN or n > REFIT_MAX:
            return False
        data = np.asarray(self.history, dtype=np.float64)
        (ha, hb, hc), *_ = np.linalg.lstsq(data[:, :3], data[:, 3], rcond=None)
        self.history_coef = (max(float(ha), _A_FLOOR), max(float(hb), 0.0), float(hc))
        return True


def dcpp_requests(lengths: Iterable[int], planner: DcppPlanner, *, first_id: int = 0) -> list[Request]:
    """Requests of the given prompt lengths cut by ``planner`` (feed them to ``build_cpp``)."""
    return [Request(first_id + i, tuple(planner.chunk_sizes(n))) for i, n in enumerate(lengths)]


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown DCPP variant {variant!r}; choose one of {VARIANTS}")
