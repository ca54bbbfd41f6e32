"""What the commands show on the terminal besides their results: log lines and progress bars.

Library code logs through module loggers (``logging.getLogger(__name__)``) and never prints; the
commands turn those records into lines on stderr. Spawned ranks are fresh interpreters, so each
command's rank function calls :func:`setup_logging` as well.
"""

from __future__ import annotations

import logging
import sys
import time


def setup_logging(level: int = logging.INFO) -> None:
    """Send vpp's log records to stderr as plain lines (idempotent)."""
    root = logging.getLogger("vpp")
    if not any(getattr(h, "_vpp_cli", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._vpp_cli = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)


def progress_bar(label: str, total: int):
    """A callback ``show(done)`` drawing ``label [#####.....] done/total chunks`` on stderr when stderr
    is a terminal; otherwise (a log file, a pipe) one plain line when the step is done, never ``\r``."""
    if not sys.stderr.isatty():
        def line(done: int) -> None:
            if done >= total:
                print(f"  {label}: {done}/{total} chunks fed", file=sys.stderr, flush=True)
        return line

    def show(done: int) -> None:
        width = 30
        filled = int(width * done / max(total, 1))
        print(f"\r  {label:<28} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} chunks fed",
              end="\n" if done >= total else "", file=sys.stderr, flush=True)
    return show


class RankProgress:
    """One rank's progress through one prefill run, so that a long run never goes quiet while its last
    chunks compute: after a compute of this rank (``computed``, called by the executor), a line

        ``  round 1/1 vpp-async: rank 1 stage 2 chunk 6/8 took 41.2 s; 3/16 computes left, ~97 s left here``

    at most every ``every_s`` seconds, and after the rank's last compute when it printed before (a
    run shorter than ``every_s`` prints nothing). The time left is predicted
    from the chunk times measured so far on this rank: seconds per layer fitted as a + b x chunk index
    (tau_k grows with the prefix), summed over the (stage, chunk) computes still to come. Called with
    ``done`` (the chunks fed into stage 0) it draws ``bar`` when there is one (the rank holding stage 0)."""

    def __init__(self, label: str, rank: int, layers: dict[int, int], chunks: int, *, bar=None,
                 every_s: float = 10.0, clock=time.monotonic, stream=None):
        self.label, self.rank, self.layers, self.chunks, self.bar = label, rank, dict(layers), chunks, bar
        self.every_s, self.clock, self.stream = every_s, clock, stream
        self.times: dict[tuple[int, int], float] = {}  # (stage, chunk) -> seconds
        self.last, self.printed = clock(), False

    def __call__(self, done: int) -> None:
        if self.bar is not None:
            self.bar(done)

    def computed(self, stage: int, request, chunk: int, seconds: float) -> None:
        self.times[(stage, chunk)] = seconds
        total = len(self.layers) * self.chunks
        now = self.clock()
        if now - self.last < self.every_s and not (len(self.times) == total and self.printed):
            return  # a short run says nothing; a long one also says when the rank is done
        self.last, self.printed = now, True
        left = total - len(self.times)
        print(f"  {self.label}: rank {self.rank} stage {stage} chunk {chunk + 1}/{self.chunks} took {seconds:.1f} s; "
              f"{left}/{total} computes left, ~{self.seconds_left():.0f} s left here",
              file=self.stream or sys.stderr, flush=True)

    def seconds_left(self) -> float:
        """The computes still to come on this rank, from the per-layer chunk times measured so far."""
        points = [(k, t / max(self.layers.get(s, 1), 1)) for (s, k), t in self.times.items()]
        if not points:
            return 0.0
        mx, my = sum(k for k, _ in points) / len(points), sum(t for _, t in points) / len(points)
        var = sum((k - mx) ** 2 for k, _ in points)
        b = sum((k - mx) * (t - my) for k, t in points) / var if var else 0.0
        a = my - b * mx
        return sum(n_layers * max(a + b * k, 0.0) for s, n_layers in self.layers.items() for k in range(self.chunks)
                   if (s, k) not in self.times)


__all__ = ["RankProgress", "progress_bar", "setup_logging"]
