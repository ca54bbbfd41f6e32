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

The helper thread is a daemon: a wait abandoned after a failure (a receive from a rank that hung) may
stay blocked in gloo forever, and must not keep the process alive at exit.

:func:`rendezvous` is the bounded meeting point before a collective (the start-up exchange, barriers,
gathering traces): every rank announces itself in the store and waits, with the same deadline and
failure notices, for the others; a rank that does not come is named in the error, and under torchrun
a rank that died meanwhile (its heartbeat stopped: :mod:`vpp.parallel.liveness`) or failed stops the
wait at once, named.

Which of the two applies is a property of the process group the transfer runs on, so the executor asks
it (:func:`polls_completion`), never the machine.
"""

from __future__ import annotations

import concurrent.futures as futures
import hashlib
import itertools
import queue
import threading
import time
from typing import Callable

import torch.distributed as dist

from vpp.parallel.rendezvous import first_failure

from .teardown import abort_groups, work_error


POLLABLE_BACKENDS = ("nccl", "hccl")


def polls_completion(pg) -> bool:
    """True when ``Work.is_completed()`` on ``pg`` reports progress without ``wait()`` (NCCL, HCCL):
    asked of the process group itself (``dist.get_backend(pg)``). False for gloo and for no group."""
    if pg is None or not dist.is_initialized():
        return False
    return str(dist.get_backend(pg)).lower() in POLLABLE_BACKENDS


class ExecutionError(RuntimeError):
    """A plan could not finish. ``rank`` is the pipeline rank that failed first (if known),
    ``global_rank`` the same rank as a global rank (what a launcher reports), ``action`` what this
    rank was doing."""

    def __init__(self, message: str, *, rank: int | None = None, action: str | None = None,
                 global_rank: int | None = None):
        super().__init__(message)
        self.rank, self.action, self.global_rank = rank, action, global_rank


class DaemonExecutor:
    """Runs submitted calls in order on one daemon thread; ``submit`` returns a
    ``concurrent.futures.Future``. Unlike ``ThreadPoolExecutor`` (whose threads the interpreter joins
    at exit), a call abandoned after a failure -- a receive from a rank that hung -- may block its
    thread forever without keeping the process alive."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 -- handed to the waiting thread
                future.set_exception(exc)

    def submit(self, fn: Callable[[], object]) -> futures.Future:
        future: futures.Future = futures.Future()
        self._jobs.put((fn, future))
        return future

    def shutdown(self) -> None:
        self._jobs.put(None)  # a thread stuck in an abandoned call never reads it: it is a daemon


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
    on every rank of the run). ``rank`` and the peers are pipeline ranks unless ``label`` says otherwise."""

    def __init__(self, run_key: str, rank: int, *, timeout_s: float, poll_s: float = 0.05,
                 pollable: bool = False, global_ranks: tuple[int, ...] | None = None, label: str = "pipeline rank",
                 store=None, me_global: int | None = None):
        self.key = f"vpp/run/{run_key}/failed"
        self.label = label  # what ``rank`` and the peers are numbered as, in messages (a hand-over: "global rank")
        self.rank, self.timeout_s, self.poll_s = rank, timeout_s, poll_s
        self.pollable = pollable  # Work.is_completed() is meaningful (NCCL, HCCL), see the module docstring
        self.global_ranks = global_ranks  # pipeline rank -> global rank, to name a peer to the launcher
        self.store = store if store is not None else default_store()
        self.me_global = me_global if me_global is not None else self._global(rank)
        self._pool: DaemonExecutor | None = None

    def _global(self, peer: int | None) -> int | None:
        if peer is None or self.global_ranks is None or not 0 <= peer < len(self.global_ranks):
            return None
        return self.global_ranks[peer]

    def close(self) -> None:
        # a wait abandoned after a failure may still block its thread (a daemon): do not join it
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def notify_failure(self, message: str, global_rank: int | None = None) -> None:
        """Tell every rank of the run that a rank failed (first notice wins): ``global_rank``, the rank at
        fault (this one, or the one whose failure stopped it), goes with the notice, so that the ranks
        it stops name it (``ExecutionError.global_rank``: what a launcher blames)."""
        if self.store is None:
            return
        try:
            self.store.compare_set(self.key, "", f"{-1 if global_rank is None else int(global_rank)} {message}")
        except Exception:
            pass

    def failure_notice(self) -> str | None:
        return self._notice()[1]

    def failure(self) -> tuple[int | None, str | None]:
        """The run's failure notice as (the global rank at fault or None, the message), or (None, None)."""
        return self._notice()

    def _notice(self) -> tuple[int | None, str | None]:
        """The run's failure notice: (the global rank at fault or None, the message), or (None, None)."""
        if self.store is None:
            return None, None
        try:
            if self.store.check([self.key]):
                rank, message = self.store.get(self.key).decode().split(" ", 1)
                return (None if int(rank) < 0 else int(rank)), message
        except Exception:
            return None, None
        return None, None

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
            raise ExecutionError(f"{self.label} {self.rank} needs a completion notice for request {request} "
                                 f"at {what}, but the process group has no key-value store", action=what)
        deadline = time.monotonic() + self.timeout_s
        key = self._done_key(request)
        while not self.store.check([key]):
            culprit, notice = self._notice()
            if notice is not None:
                raise ExecutionError(f"{self.label} {self.rank} stopped at {what} because {notice}", action=what,
                                     global_rank=culprit)
            if time.monotonic() > deadline:
                err = self.timed_out(what, peer)
                raise ExecutionError(f"{err} (request {request} to finish)", rank=err.rank, action=what,
                                     global_rank=err.global_rank)
            time.sleep(min(self.poll_s, 0.005))

    def wait(self, work: dist.Work, what: str, peer: int | None) -> None:
        """``work.wait()``, but raise :class:`ExecutionError` when another rank reports a failure, the
        connection breaks, or ``timeout_s`` passes."""
        if self.pollable:
            return self._poll_then_wait(work, what, peer)
        if self._pool is None:
            self._pool = DaemonExecutor("vpp-wait")
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
                self._check(what, peer, deadline)
                continue
            except Exception as exc:  # the transfer itself failed: usually the peer went away
                raise self.transfer_failed(what, peer, exc) from exc

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
            raise self.transfer_failed(what, peer, exc) from exc

    def post(self, start: Callable[[], "dist.Work"], what: str, peer: int | None):
        """``start()``: post a transfer with ``peer`` and return its work. Posting to a peer that already
        closed its connections raises at once (gloo: "Connection closed by peer"), before any wait could
        read a failure notice: that error reads as the wait's would (:meth:`transfer_failed`: the notice's
        culprit, or ``peer`` stopped responding). Any other error of the post (a local one) passes as is."""
        try:
            return start()
        except Exception as exc:
            if peer_gone(exc) or self.failure_notice() is not None:
                raise self.transfer_failed(what, peer, exc) from exc
            raise

    def complete(self, start: Callable[[], "dist.Work"], what: str, peer: int | None) -> None:
        """Post a transfer with ``peer`` (:meth:`post`) and wait for it (:meth:`wait`)."""
        self.wait(self.post(start, what, peer), what, peer)

    def transfer_failed(self, what: str, peer: int | None, exc: BaseException) -> ExecutionError:
        """The error of a transfer with ``peer`` that ended in ``exc``, worded the same whichever path saw
        it first (the rank's own wait or the watch thread): the process group's own timeout reads as vpp's
        deadline; otherwise a failure notice posted meanwhile names the culprit, or the peer stopped
        responding (usually it went away: gloo's "Connection closed by peer", NCCL's aborted communicator)."""
        if _timed_out(exc):
            return self.timed_out(what, peer)
        cause = self.failure_notice() or f"{self.label} {peer} stopped responding ({type(exc).__name__}: {exc})"
        return ExecutionError(f"{self.label} {self.rank} gave up at {what}: {cause}", rank=peer, action=what,
                              global_rank=self._global(peer))

    def _check(self, what: str, peer: int | None, deadline: float) -> None:
        culprit, notice = self._notice()
        if notice is not None:
            raise ExecutionError(f"{self.label} {self.rank} stopped at {what} because {notice}", action=what,
                                 global_rank=culprit)
        if time.monotonic() > deadline:
            raise self.timed_out(what, peer)

    def _waits_key(self, global_rank: int) -> str:
        return self.key.replace("/failed", f"/waits/{global_rank}")

    def timed_out(self, what: str, peer: int | None) -> ExecutionError:
        """The error of a wait for ``peer`` past its deadline. Ranks behind a hung one time out too, at
        about the same time: each says in the store whom it waited for, gives the others ``grace`` to
        say the same, then follows the chain (this rank waited for P, P for Q, Q for nobody: Q is at
        fault) or takes a failure notice posted meanwhile."""
        blame, suspect = peer, self._global(peer)
        if self.store is not None and self.me_global is not None and suspect is not None:
            try:
                self.store.set(self._waits_key(self.me_global), str(suspect))
                time.sleep(min(self.timeout_s / 4, max(10 * self.poll_s, 0.1)))
                culprit, notice = self._notice()
                if notice is not None:
                    return ExecutionError(f"{self.label} {self.rank} stopped at {what} because {notice}", action=what,
                                          global_rank=culprit)
                seen = {self.me_global}
                while suspect not in seen and self.store.check([self._waits_key(suspect)]):
                    seen.add(suspect)
                    suspect = int(self.store.get(self._waits_key(suspect)).decode())
                if suspect in seen:  # a cycle: the ranks wait for each other, none is known to be at fault
                    suspect = self._global(peer)
                if suspect != self._global(peer) and self.global_ranks is not None and suspect in self.global_ranks:
                    blame = self.global_ranks.index(suspect)
            except Exception:  # the store is a best effort here: blame the peer
                blame, suspect = peer, self._global(peer)
        via = "" if blame == peer else f" (which waited for {self.label} {blame})"
        return ExecutionError(f"{self.label} {self.rank} timed out after {self.timeout_s:g}s at {what} waiting for "
                              f"{self.label} {peer}{via}", rank=blame, action=what, global_rank=suspect)


class WorkWatch:
    """The device path's watchdog: a thread, not the rank's own, that checks every ``poll_s`` the work
    the rank has enqueued (NCCL/HCCL transfers, posted and not yet seen complete) against its deadline
    (posting time + ``timeout_s``) and the store's failure notices. The rank's thread never waits for a
    transfer, so it cannot notice a fault there: it calls :meth:`check` between actions and while it
    waits for the device (:meth:`.device_order.StreamOps.host_wait`), which raises what the thread
    found. ``Work.is_completed()`` is a non-blocking query of the work's end event; the process group's
    own timeout (the same ``timeout_s``) stays in force underneath.

    ``select_device``: called first on the thread (``torch.cuda.set_device`` / ``torch.npu.set_device``
    for the rank's device), as torch's own watchdog and torch_npu's do: querying an event from a thread
    whose current device is another creates a context there (CUDA) or fails the query (NPU). A work
    that completed with an error (``is_completed()`` is true for it: NCCL/HCCL set the error and mark
    it done) is reported at once, naming the peer of that transfer."""

    def __init__(self, watchdog: Watchdog, *, select_device: Callable[[], None] | None = None):
        self.dog = watchdog
        self.select_device = select_device
        self._lock = threading.Lock()
        self._works: dict[int, tuple] = {}  # posting number -> (work, what, peer, deadline)
        self._posted = 0
        self.error: ExecutionError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vpp-watchdog", daemon=True)
        self._thread.start()

    @property
    def outstanding(self) -> int:
        with self._lock:
            return len(self._works)

    def watch(self, work, what: str, peer: int | None) -> None:
        with self._lock:
            self._works[self._posted] = (work, what, peer, time.monotonic() + self.dog.timeout_s)
            self._posted += 1

    def check(self) -> None:
        """Raise the fault the watchdog thread found, if any (called on the rank's thread)."""
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=max(1.0, 4 * self.dog.poll_s))

    def _loop(self) -> None:
        if self.select_device is not None:
            try:
                self.select_device()
            except Exception as exc:  # noqa: BLE001 -- reported on the rank's thread
                self.error = ExecutionError(f"{self.dog.label} {self.dog.rank}'s watchdog could not select its "
                                            f"device ({type(exc).__name__}: {exc})")
                return
        while self.error is None and not self._stop.wait(self.dog.poll_s):
            try:
                self.scan()
            except ExecutionError as exc:
                self.error = exc

    def scan(self) -> None:
        """One round of checks (the thread's loop body; raises :class:`ExecutionError`)."""
        with self._lock:
            items = sorted(self._works.items())
        culprit, notice = self.dog._notice()
        if notice is not None:
            what = items[0][1][1] if items else "its next action"
            raise ExecutionError(f"{self.dog.label} {self.dog.rank} stopped at {what} because {notice}", action=what,
                                 global_rank=culprit)
        now = time.monotonic()
        for n, (work, what, peer, deadline) in items:
            try:
                done = work.is_completed()
            except Exception as exc:
                raise self.dog.transfer_failed(what, peer, exc) from exc
            if done:
                failure = work_error(work)
                if failure is not None:  # worded as the rank's own wait words it (the first to see it wins)
                    raise self.dog.transfer_failed(what, peer, failure)
                with self._lock:
                    self._works.pop(n, None)
            elif now > deadline:
                raise self.dog.timed_out(what, peer)


# how transports word a peer that went away (gloo: "Connection closed by peer", "Connection reset by
# peer"; a socket written after the peer closed: "Broken pipe")
_GONE = ("connection closed", "connection reset", "broken pipe", "connection refused", "socket closed")


def peer_gone(exc: BaseException) -> bool:
    """A transfer's error that says the peer's end of the connection is gone."""
    text = str(exc).lower()
    return any(words in text for words in _GONE)


def _timed_out(exc: BaseException) -> bool:
    """A transfer's error that is the process group's own timeout (gloo: "Timed out waiting ...",
    NCCL: "Watchdog caught collective operation timeout"): reported as vpp's deadline is."""
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text


_ROUNDS: dict[tuple, itertools.count] = {}  # per (members, caller): they all make the same sequence of calls


def rendezvous(what: str, me: int, world, *, timeout_s: float, poll_s: float = 0.01) -> None:
    """Wait until all ``world`` global ranks (a count: ranks ``0 .. world - 1``; or the members' global
    ranks, e.g. one instance of a disaggregated world) reached the same (``what``, call number) point,
    for at most ``timeout_s``; then raise :class:`ExecutionError` naming the global ranks that did not
    come (``global_rank`` = the first of them). A no-op without a process group or its store."""
    members = tuple(range(world)) if isinstance(world, int) else tuple(world)
    n = next(_ROUNDS.setdefault((members, me), itertools.count()))  # me: ranks as threads of one process count apart
    store = default_store()
    if store is None or len(members) <= 1:
        return
    # members other than 0..n-1 (an instance, a pair): their own keys, named by a digest of who they are
    scope = "" if members == tuple(range(len(members))) else hashlib.sha1(repr(members).encode()).hexdigest()[:12] + "/"
    keys = {r: f"vpp/meet/{scope}{n}/{r}" for r in members}
    store.set(keys[me], what)
    deadline = time.monotonic() + timeout_s
    for spin in itertools.count():
        if store.check(list(keys.values())):
            return
        failure = first_failure(store) if spin % 10 == 0 else None  # a rank that died or failed (under torchrun)
        if failure is not None:
            raise ExecutionError(f"global rank {me} stopped at {what} because {failure[1]}", action=what,
                                 global_rank=failure[0])
        if time.monotonic() > deadline:
            missing = [r for r, k in keys.items() if not store.check([k])]
            if not missing:
                return
            raise ExecutionError(f"global rank {me} waited {timeout_s:g}s at {what} for global rank(s) {missing}, "
                                 f"which never arrived", rank=None, action=what, global_rank=missing[0])
        time.sleep(poll_s)


__all__ = [
    "DaemonExecutor", "ExecutionError", "POLLABLE_BACKENDS", "Watchdog", "WorkWatch", "abort_groups",
    "default_store", "polls_completion", "rendezvous", "work_error",
]
