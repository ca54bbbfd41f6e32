"""Waiting on communication without ever hanging, and telling every rank who failed.

gloo has no way to poll a pending receive (``Work.is_completed()`` stays False until ``wait()`` runs)
and ``Work.wait(timeout)`` tears the connection down, so a rank cannot simply poll. Instead each
wait runs in one helper thread while the rank's own thread checks, every ``poll_s``, two things: a
failure notice in the process group's key-value store (written by a rank that raised, naming itself
and the action it was on) and its own deadline. A rank that dies outright breaks the connection, so
the pending wait raises at once; a rank that hangs is caught by the deadline.

On NCCL and HCCL ``wait()`` must run on the rank's own thread: it makes that thread's current stream
wait for the transfer, and a helper thread would order the wrong stream. There ``is_completed()``
works, so the rank polls it (with the same notice and deadline checks) and then waits in place.
Which of the two applies is a property of the process group the transfer runs on, so the executor asks
it (:func:`polls_completion`), never the machine.
"""

from __future__ import annotations

import concurrent.futures as futures
import time

import torch.distributed as dist


POLLABLE_BACKENDS = ("nccl", "hccl")


def polls_completion(pg) -> bool:
    """True when ``Work.is_completed()`` on ``pg`` reports progress without ``wait()`` (NCCL, HCCL):
    asked of the process group itself (``dist.get_backend(pg)``). False for gloo and for no group."""
    if pg is None or not dist.is_initialized():
        return False
    return str(dist.get_backend(pg)).lower() in POLLABLE_BACKENDS


class ExecutionError(RuntimeError):
    """A plan could not finish. ``rank`` is the pipeline rank that failed first (if known), ``action``
    what this rank was doing."""

    def __init__(self, message: str, *, rank: int | None = None, action: str | None = None):
        super().__init__(message)
        self.rank, self.action = rank, action


def default_store():
    """The key-value store behind the default process group, or None (single process, or a torch
    without the hook)."""
    if not dist.is_initialized():
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # private API: lose failure notices, never break a run
        return None


class Watchdog:
    """Failure notices and bounded waits for one executor run, identified by ``run_key`` (the same
    on every rank of the run)."""

    def __init__(self, run_key: str, rank: int, *, timeout_s: float, poll_s: float = 0.05,
                 pollable: bool = False):
        self.key = f"vpp/run/{run_key}/failed"
        self.rank, self.timeout_s, self.poll_s = rank, timeout_s, poll_s
        self.pollable = pollable  # Work.is_completed() is meaningful (NCCL, HCCL), see the module docstring
        self.store = default_store()
        self._pool = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="vpp-wait")

    def close(self) -> None:
        # a wait abandoned after a failure may still block its thread: do not join it
        self._pool.shutdown(wait=False, cancel_futures=True)

    def notify_failure(self, message: str) -> None:
        """Tell every rank of the run that this rank failed (first notice wins)."""
        if self.store is None:
            return
        try:
            self.store.compare_set(self.key, "", message)
        except Exception:
            pass

    def failure_notice(self) -> str | None:
        if self.store is None:
            return None
        try:
            if self.store.check([self.key]):
                return self.store.get(self.key).decode()
        except Exception:
            return None
        return None

    def _done_key(self, request: int) -> str:
        return self.key.replace("/failed", f"/done/{request}")

    def mark_done(self, request: int) -> None:
        """Announce that ``request`` has finished (its last chunk left the last stage): the admission
        notice for a request gated on it whose stage 0 lives on another rank."""
        if self.store is not None:
            self.store.set(self._done_key(request), "1")

    def wait_done(self, request: int, what: str, peer: int | None) -> None:
        """Wait for :meth:`mark_done` of ``request`` on another rank, with the same failure checks and
        deadline as :meth:`wait`."""
        if self.store is None:
            raise ExecutionError(f"pipeline rank {self.rank} needs a completion notice for request {request} "
                                 f"at {what}, but the process group has no key-value store", action=what)
        deadline = time.monotonic() + self.timeout_s
        key = self._done_key(request)
        while not self.store.check([key]):
            notice = self.failure_notice()
            if notice is not None:
                raise ExecutionError(f"pipeline rank {self.rank} stopped at {what} because {notice}", action=what)
            if time.monotonic() > deadline:
                raise ExecutionError(f"pipeline rank {self.rank} timed out after {self.timeout_s:g}s at {what} "
                                     f"waiting for request {request} to finish on pipeline rank {peer}",
                                     rank=peer, action=what)
            time.sleep(min(self.poll_s, 0.005))

    def wait(self, work: dist.Work, what: str, peer: int | None) -> None:
        """``work.wait()``, but raise :class:`ExecutionError` when another rank reports a failure, the
        connection breaks, or ``timeout_s`` passes."""
        if self.pollable:
            return self._poll_then_wait(work, what, peer)
        self.wait_future(self._pool.submit(work.wait), what, peer)

    def wait_future(self, future: futures.Future, what: str, peer: int | None) -> None:
        """Wait for ``future`` (a ``work.wait()`` running on a helper thread) with the same failure
        checks and deadline as :meth:`wait`."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                future.result(timeout=self.poll_s)
                return
            except futures.TimeoutError:
                pass
            except Exception as exc:  # the transfer itself failed: usually the peer went away
                notice = self.failure_notice()
                cause = notice or f"pipeline rank {peer} stopped responding ({type(exc).__name__}: {exc})"
                raise ExecutionError(f"pipeline rank {self.rank} gave up at {what}: {cause}",
                                     rank=peer, action=what) from exc
            self._check(what, peer, deadline)

    def _poll_then_wait(self, work: dist.Work, what: str, peer: int | None) -> None:
        deadline, pause, checked = time.monotonic() + self.timeout_s, 1e-5, time.monotonic()
        while not work.is_completed():
            if time.monotonic() - checked >= self.poll_s:  # the store is a round trip: not every spin
                self._check(what, peer, deadline)
                checked = time.monotonic()
            time.sleep(pause)
            pause = min(pause * 2, self.poll_s)
        try:
            work.wait()
        except Exception as exc:
            cause = self.failure_notice() or f"pipeline rank {peer} stopped responding ({type(exc).__name__}: {exc})"
            raise ExecutionError(f"pipeline rank {self.rank} gave up at {what}: {cause}", rank=peer, action=what) from exc

    def _check(self, what: str, peer: int | None, deadline: float) -> None:
        notice = self.failure_notice()
        if notice is not None:
            raise ExecutionError(f"pipeline rank {self.rank} stopped at {what} because {notice}", action=what)
        if time.monotonic() > deadline:
            raise ExecutionError(
                f"pipeline rank {self.rank} timed out after {self.timeout_s:g}s at {what} waiting for "
                f"pipeline rank {peer}", rank=peer, action=what)
