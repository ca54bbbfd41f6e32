"""Timing compute spans without synchronising the device in the per-chunk path.

On CPU a stage call runs its kernels in the calling thread, so the host clock around the call is its
compute time. On CUDA/NPU the call only queues kernels: timing it with the host clock needs a device
synchronisation after every compute, which stalls the queue once per chunk. Instead
:class:`ComputeTimer` records a device event before and after each compute (asynchronous, a few
microseconds) and turns the events into seconds once, after the run, with a single synchronisation
(``finish``). Event times are measured from an origin event recorded when the timer starts (the
executor's time origin, after one synchronisation there), so compute spans and the host-clock spans of
communication share one axis.

Without events (``events=None``: CPU, or an accelerator run that asked for no trace) spans come from
the host clock; on an accelerator they are then dispatch times, not compute times, and the executor's
trace says so (``meta["timing"]``).
"""

from __future__ import annotations

import time
from typing import Callable

from vpp.schedules.trace import Span


class ComputeTimer:
    """Compute spans of one executor run on pipeline rank ``rank``.

    ``events()`` makes a timing event (``record()``, ``elapsed_time(end)`` in milliseconds), e.g.
    ``torch.cuda.Event(enable_timing=True)``; ``synchronize()`` waits for the device. Both None: host
    clock. ``origin`` is the host clock's zero (``time.perf_counter()`` at the run's start).
    """

    def __init__(self, rank: int, origin: float, *, events: Callable[[], object] | None = None,
                 synchronize: Callable[[], None] | None = None):
        self.rank, self.origin = rank, origin
        self._events, self._synchronize = events, synchronize
        self._pending: list[tuple] = []  # (start event, end event, stage, request, chunk)
        self._spans: list[Span] = []
        self._origin_event = None
        if events is not None:
            if synchronize is None:
                raise ValueError("device events need a synchronize() to resolve them")
            synchronize()  # once per run: the origin event then marks the host origin on the device
            self._origin_event = events()
            self._origin_event.record()

    @property
    def mode(self) -> str:
        return "host" if self._events is None else "device-events"

    def begin(self):
        """Mark the start of a compute (before the stage call)."""
        if self._events is None:
            return time.perf_counter()
        start = self._events()
        start.record()
        return start

    def end(self, mark, stage: int, request: int, chunk: int) -> None:
        """Mark the end of the compute begun at ``mark`` (after the stage call returned)."""
        if self._events is None:
            now = time.perf_counter()
            self._spans.append(Span(self.rank, "compute", mark - self.origin, now - self.origin, stage, request, chunk))
            return
        stop = self._events()
        stop.record()
        self._pending.append((mark, stop, stage, request, chunk))

    def finish(self) -> list[Span]:
        """Every compute span, in the order recorded (one device synchronisation when events are used)."""
        if self._pending:
            self._synchronize()
            zero = self._origin_event
            for start, stop, stage, request, chunk in self._pending:
                t0, t1 = zero.elapsed_time(start) / 1e3, zero.elapsed_time(stop) / 1e3
                self._spans.append(Span(self.rank, "compute", t0, t1, stage, request, chunk))
            self._pending.clear()
        return list(self._spans)


__all__ = ["ComputeTimer"]
