"""The paper's request streams (Sec. 6.1), scaled to a machine by one factor.

Every length is the paper's token count divided by ``scale`` (rounded, at least 1 token): ``scale=32``
turns 512K into 16K and a 32K chunk budget into 1K. Arrivals are seconds from the stream start; by
default every request is there at time 0 and ``concurrency`` (a client that keeps at most that many
requests outstanding) decides when each is handed over, as in the paper's benchmarks; ``rate`` (requests
per second) draws seeded Poisson arrivals instead.

* :func:`short` -- 100 concurrent requests of 4K, 8K or 16K tokens (one length for all, or drawn
  uniformly from the three, seeded).
* :func:`long`  -- one request at a time (concurrency 1), growing lengths 64K .. 1M; ``repeat`` and
  ``concurrency`` give the Sec. 6.4 ablation stream (256K requests, 3 concurrent).
* :func:`mixed` -- 500 requests, concurrency 16, lengths from a heavy-tailed distribution with the
  published statistics of the GSM8K-derived set: min 7, median ~10K, mean ~22.5K, p90 ~64K, max 122,710.

The mixed lengths are a log-normal clipped to [7, 122710]: the median fixes mu = ln 10000, the p90
fixes sigma = ln 6.4 / z_0.9 = 1.4485, and clipping the upper tail at the published maximum (4.2% of
the mass lands on it) brings the mean from 28.5K to 22.57K, the published ~22.5K, with no further
parameter. The body puts ~1e-7 of its mass below 7 tokens, so a sample would never show the published
minimum; the shortest request of a sample is therefore set to 7 tokens. A seeded sample of 200,000
reproduces the median, mean and p90 within 2% (``tests/schedules/test_workloads.py``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

from .ir import Request, chunk_requests

SHORT_LENGTHS = (4096, 8192, 16384)
LONG_LENGTHS = (65536, 131072, 262144, 524288, 1048576)
MIXED_STATS = {"n": 500, "concurrency": 16, "min": 7, "median": 10_000, "mean": 22_500, "p90": 64_000,
               "max": 122_710}
MIXED_MU = math.log(MIXED_STATS["median"])
MIXED_SIGMA = math.log(MIXED_STATS["p90"] / MIXED_STATS["median"]) / NormalDist().inv_cdf(0.9)


@dataclass(frozen=True)
class Workload:
    """A request stream: prompt ``lengths`` (tokens, already scaled), ``arrivals`` (seconds) and the
    client's ``concurrency`` limit (None: unlimited)."""

    name: str
    lengths: tuple[int, ...]
    arrivals: tuple[float, ...]
    concurrency: int | None
    scale: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(int(n) for n in self.lengths))
        object.__setattr__(self, "arrivals", tuple(float(a) for a in self.arrivals))
        if len(self.lengths) != len(self.arrivals):
            raise ValueError(f"{len(self.lengths)} lengths but {len(self.arrivals)} arrival times")
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(f"workload {self.name!r} needs at least one prompt of >= 1 token")
        if list(self.arrivals) != sorted(self.arrivals):
            raise ValueError(f"workload {self.name!r}: arrivals must not decrease (requests are admitted in order)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency} must be >= 1 (or None: unlimited)")

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def requests(self, chunk_size: int | None = None, *, planner=None) -> list[Request]:
        """The stream as requests: cut into ``chunk_size`` chunks, or by a DCPP ``planner``
        (:class:`.dcpp.DcppPlanner`), with the arrivals."""
        if (chunk_size is None) == (planner is None):
            raise ValueError("give exactly one of chunk_size and planner")
        if planner is None:
            return chunk_requests(self.lengths, chunk_size, arrivals=self.arrivals)
        return [Request(i, tuple(planner.chunk_sizes(n)), a) for i, (n, a) in enumerate(zip(self.lengths, self.arrivals))]

    def describe(self) -> str:
        k = "unlimited" if self.concurrency is None else self.concurrency
        return (f"{self.name}: {len(self)} requests, {self.tokens} tokens (lengths {min(self.lengths)}.."
                f"{max(self.lengths)}, scale 1/{self.scale}), concurrency {k}")


def scaled(tokens: int, scale: float) -> int:
    """The paper's token count divided by ``scale``, at least one token."""
    if scale <= 0:
        raise ValueError(f"scale={scale} must be > 0")
    return max(1, int(round(tokens / scale)))


def poisson_arrivals(n: int, rate: float | None, seed: int = 0) -> tuple[float, ...]:
    """``n`` arrival times: all 0 without a rate, else a seeded Poisson process of ``rate`` per second
    (the first request at 0)."""
    if rate is None:
        return (0.0,) * n
    if rate <= 0:
        raise ValueError(f"rate={rate} requests/s must be > 0")
    rng = random.Random(seed)
    out, now = [0.0], 0.0
    for _ in range(n - 1):
        now += rng.expovariate(rate)
        out.append(now)
    return tuple(out)


def short(scale: float = 32, seed: int = 0, *, n: int = 100, length: int | None = None,
          concurrency: int | None = None, rate: float | None = None) -> Workload:
    """``n`` requests of ``length`` tokens (one of 4K / 8K / 16K before scaling; default: each drawn
    uniformly from the three), all concurrent (``concurrency`` defaults to ``n``)."""
    if length is not None and length < 1:
        raise ValueError(f"length={length} must be >= 1 token")
    rng = random.Random(seed)
    paper = [length] * n if length is not None else [rng.choice(SHORT_LENGTHS) for _ in range(n)]
    return Workload("short", tuple(scaled(x, scale) for x in paper), poisson_arrivals(n, rate, seed),
                    n if concurrency is None else concurrency, int(scale))


def long(scale: float = 32, lengths: Sequence[int] = LONG_LENGTHS, *, repeat: int = 1, concurrency: int | None = 1,
         rate: float | None = None, seed: int = 0) -> Workload:
    """Long prompts (the paper's ``lengths``, each ``repeat`` times), one at a time by default."""
    if repeat < 1:
        raise ValueError(f"repeat={repeat} must be >= 1")
    paper = [x for x in lengths for _ in range(repeat)]
    return Workload("long", tuple(scaled(x, scale) for x in paper), poisson_arrivals(len(paper), rate, seed),
                    concurrency, int(scale))


def mixed_lengths(n: int, seed: int = 0) -> list[int]:
    """``n`` paper-scale prompt lengths with the published statistics (see the module docstring)."""
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    rng = random.Random(seed)
    lo, hi = MIXED_STATS["min"], MIXED_STATS["max"]
    out = [min(max(int(round(rng.lognormvariate(MIXED_MU, MIXED_SIGMA))), lo), hi) for _ in range(n)]
    out[out.index(min(out))] = lo
    return out


def mixed(scale: float = 32, seed: int = 0, n: int = 500, concurrency: int | None = 16,
          rate: float | None = None) -> Workload:
    """``n`` requests with heavy-tailed lengths (the published statistics), ``concurrency`` in flight."""
    lengths = tuple(scaled(x, scale) for x in mixed_lengths(n, seed))
    return Workload("mixed", lengths, poisson_arrivals(n, rate, seed), concurrency, int(scale))


__all__ = [
    "LONG_LENGTHS", "MIXED_MU", "MIXED_SIGMA", "MIXED_STATS", "SHORT_LENGTHS", "Workload", "long", "mixed",
    "mixed_lengths", "poisson_arrivals", "scaled", "short",
]
