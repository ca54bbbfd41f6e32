"""Asynchronous sends whose buffers are released as soon as each send completes.

An asynchronous send keeps its tensor alive until the transfer is done. Holding every send until the
plan ends (the simple way) keeps one activation per chunk and outgoing hop: about one whole prompt of
hidden states per hop. :class:`SendQueue` holds a send only while it is in flight:

* NCCL / HCCL (``pollable``): ``Work.is_completed()`` reports completion, so :meth:`SendQueue.sweep`
  (called by the executor between actions) drops every finished send.
* gloo: ``is_completed()`` stays False until ``wait()`` has run, so one helper thread waits for the
  sends in posting order and drops each as it completes. The rank's own thread never waits on it
  during the run; waits of different sends never block a receive (the watchdog uses another thread).

:meth:`SendQueue.finish` waits for the rest at the end of the plan, through the watchdog (failure
notices, deadline). ``max_live`` is the largest number of send buffers held at once.
"""

from __future__ import annotations

import threading

import torch

from .watchdog import DaemonExecutor, Watchdog


class SendQueue:
    def __init__(self, watchdog: Watchdog, *, pollable: bool):
        self.watchdog, self.pollable = watchdog, pollable
        self._lock = threading.Lock()
        self._live: dict[int, tuple] = {}  # posting number -> (work, tensor, action, future or None)
        self._posted = 0
        self.max_live = 0
        self._reaper = None if pollable else DaemonExecutor("vpp-send")

    @property
    def live(self) -> int:
        """Send buffers held now (posted, not yet seen complete)."""
        with self._lock:
            return len(self._live)

    def post(self, work, tensor: torch.Tensor, action) -> None:
        """Hold ``tensor`` until ``work`` (its send) completes."""
        with self._lock:
            n = self._posted
            self._posted += 1
            self._live[n] = (work, tensor, action, None)
            self.max_live = max(self.max_live, len(self._live))
        if self._reaper is not None:
            future = self._reaper.submit(work.wait)
            with self._lock:
                if n in self._live:
                    self._live[n] = (work, tensor, action, future)
            future.add_done_callback(lambda f, n=n: self._drop_if_ok(n, f))

    def _drop_if_ok(self, n: int, future) -> None:
        if future.cancelled() or future.exception() is not None:
            return  # kept: finish() reports it through the watchdog
        with self._lock:
            self._live.pop(n, None)

    def works(self) -> list:
        """The works of the sends still held, in posting order."""
        with self._lock:
            return [self._live[n][0] for n in sorted(self._live)]

    def sweep(self) -> None:
        """Drop the sends that have completed (NCCL/HCCL; the helper thread does it on gloo)."""
        if not self.pollable:
            return
        with self._lock:
            done = [n for n, (work, *_rest) in self._live.items() if work.is_completed()]
            for n in done:
                del self._live[n]

    def finish(self, now) -> list[tuple]:
        """Wait for every send still held; returns (start, end, action) of the waits that blocked."""
        blocked = []
        while True:
            with self._lock:
                if not self._live:
                    break
                n = min(self._live)
                work, _, action, future = self._live[n]
            start = now()
            if future is None:
                self.watchdog.wait(work, str(action), action.peer)
            else:
                self.watchdog.wait_future(future, str(action), action.peer)
            end = now()
            with self._lock:
                self._live.pop(n, None)
            if end > start:
                blocked.append((start, end, action))
        return blocked

    def close(self) -> None:
        if self._reaper is not None:
            # a send abandoned after a failure may still block its thread (a daemon): do not join it
            self._reaper.shutdown()


__all__ = ["SendQueue"]
