"""Heartbeats through the rendezvous store, so that a rank that died is noticed on every node.

torchrun's agent notices a dead worker of its own node and stops that node, but tells no other node:
the ranks there would wait for the dead one until some timeout (a collective's, the start-up
rendezvous', a store wait's), which must stay long because a healthy rank may legitimately take
minutes (loading a large checkpoint). A heartbeat tells apart "slow" from "dead" without shortening
any of them:

* every rank bumps its own key in the store every ``beat_s`` seconds (a daemon thread on a store
  connection of its own, so that a store wait blocking the rank's main thread does not stop it), with
  the phase it is in (:attr:`Heartbeat.phase`); a rank that finished says so (:meth:`Heartbeat.finish`);
* every rank watches one other, the next one that has not finished (global rank r watches r + 1,
  wrapping): a key that has not moved for ``silent_s`` seconds of the watcher's clock means that rank
  died (or stopped: SIGSTOP, a debugger). The watcher then records the first failure in the store
  (:func:`~vpp.parallel.rendezvous.announce_failure`), naming the rank and its last phase; every wait
  of vpp that polls the store (the start-up rendezvous, the meetings of
  :func:`vpp.runtime.watchdog.rendezvous`) stops on it at once;
* a rank whose main thread is blocked where nothing polls (a collective or a store wait inside torch,
  e.g. creating a process group with a dead peer) cannot raise: once a failure has been recorded,
  a rank still running ``exit_grace_s`` seconds later writes torchrun's error file and ends its
  process with one line on stderr, as torch's NCCL watchdog does with a timed-out collective.

Watching one neighbour keeps the store's load at a few operations per rank and beat, whatever the
world size; a node that dies takes consecutive ranks with it, and the rank before them, on another node,
notices. A rank that died before it ever beat (during its interpreter's start-up, before it reached
:func:`~vpp.parallel.rendezvous.init_distributed`) cannot be told from a slow one: the start-up
rendezvous' own timeout bounds that wait.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

BEAT_S = 1.0  # one store write per rank and second
SILENT_S = 10.0  # a healthy rank's heartbeat thread is never held that long (it needs the GIL for microseconds)
EXIT_GRACE_S = 10.0  # after a recorded failure, for the rank to fail by itself (raise, print its line, exit)
DONE = "done"


class Heartbeat:
    """One rank's heartbeat and its watch on the next rank (module docstring). Built unstarted by the
    launcher, started by :func:`~vpp.parallel.rendezvous.init_distributed` once the rank reached the
    rendezvous store, finished when the rank's work returned.

    ``announce(store, rank, message)`` records a failure (first one wins) and ``first_failure(store)``
    reads it back as ``(rank, message)`` or None; ``on_exit(message)`` ends the process (writes the
    launcher's error file, then ``os._exit``)."""

    def __init__(self, announce: Callable, first_failure: Callable, on_exit: Callable[[str], None], *,
                 beat_s: float = BEAT_S, silent_s: float = SILENT_S, exit_grace_s: float = EXIT_GRACE_S):
        self.announce, self.first_failure, self.on_exit = announce, first_failure, on_exit
        self.beat_s, self.silent_s, self.exit_grace_s = beat_s, silent_s, exit_grace_s
        self._phase = "starting"
        self._n = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def phase(self) -> str:
        """What this rank is doing, as its watcher will report it ("global rank 3 died <phase>")."""
        return self._phase

    @phase.setter
    def phase(self, text: str) -> None:
        self._phase = text
        if self._thread is not None:  # at once: a rank may die before the next beat
            try:
                self._beat()
            except Exception:  # noqa: BLE001 -- the thread's next beat reports a lost store
                pass

    def start(self, store, prefix: str, rank: int, world_size: int) -> None:
        """Beat and watch on ``store`` (a connection of this heartbeat's own) under ``prefix``."""
        self.store, self.prefix, self.rank, self.world_size = store, prefix, rank, world_size
        self._beat()
        self._thread = threading.Thread(target=self._loop, name="vpp-heartbeat", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        """This rank's work is done: stop beating and tell the watcher not to wait for beats any more."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.beat_s + 5)
            try:
                self.store.set(self._key(self.rank), DONE)
            except Exception:  # noqa: BLE001 -- the store may be gone with a finished node: nothing to tell
                pass

    def silent_peer(self) -> tuple[int, str] | None:
        """After a transfer of this rank lost its peer (a transport error names an address, not a rank):
        the lowest other rank whose heartbeat does not move for 3 beats, as ``(rank, "global rank R
        died <phase> ...")``, or None (no heartbeat started, or every rank beats)."""
        if self._thread is None:
            return None
        wait_s = 3 * self.beat_s
        before = self._values()
        time.sleep(wait_s)
        after = self._values()
        for r, value in sorted(after.items()):
            if value != DONE and value == before.get(r):
                return r, f"global rank {r} died {_phase(value)} (no heartbeat for {wait_s:g}s)"
        return None

    def _values(self) -> dict[int, str]:
        """Every other rank's heartbeat value (those that have one)."""
        out = {}
        for r in range(self.world_size):
            if r != self.rank and self.store.check([self._key(r)]):
                out[r] = self.store.get(self._key(r)).decode()
        return out

    def _key(self, rank: int) -> str:
        return f"{self.prefix}/{rank}"

    def _beat(self) -> None:
        self._n += 1  # from the thread and from a phase change: any new value is a sign of life
        self.store.set(self._key(self.rank), f"{self._n} {self._phase}")

    def _loop(self) -> None:
        failed_at, lost_since = None, None
        watch = _PeerWatch(self)
        while not self._stop.wait(self.beat_s):
            now = time.monotonic()
            try:
                self._beat()
                failure = self.first_failure(self.store)
                if failure is None:
                    dead = watch.dead(now)
                    if dead is not None:
                        self.announce(self.store, *dead)
                        failure = self.first_failure(self.store)
                lost_since = None
            except Exception as exc:  # noqa: BLE001 -- the store's host (node 0's agent) went away
                lost_since = lost_since or now
                if now - lost_since < self.silent_s:
                    continue
                failure = (None, f"lost the rendezvous store for {self.silent_s:g}s ({type(exc).__name__}: {exc})")
            if failure is not None:
                failed_at = failed_at or now
                if now - failed_at >= self.exit_grace_s and not self._stop.is_set():
                    message = failure[1]
                    self.on_exit(f"global rank {self.rank} still ran {self.exit_grace_s:g}s after a failure, "
                                 f"blocked where vpp cannot interrupt it; ending it: {message}")
                    return


class _PeerWatch:
    """The watched rank: the next one after ours that has not finished; dead once its key has not
    changed for ``silent_s`` seconds (never judged before its first beat)."""

    def __init__(self, beat: Heartbeat):
        self.beat = beat
        self.peer = (beat.rank + 1) % beat.world_size
        self.seen: str | None = None
        self.since = time.monotonic()

    def dead(self, now: float) -> tuple[int, str] | None:
        b = self.beat
        while self.peer != b.rank:
            key = b._key(self.peer)
            value = b.store.get(key).decode() if b.store.check([key]) else None
            if value != DONE:
                break
            self.peer, self.seen, self.since = (self.peer + 1) % b.world_size, None, now
        if self.peer == b.rank:
            return None  # every other rank finished
        if value is None or value != self.seen:
            self.seen, self.since = value, now
            return None
        if now - self.since < b.silent_s:
            return None
        return self.peer, f"global rank {self.peer} died {_phase(value)} (no heartbeat for {now - self.since:.0f}s)"


def _phase(value: str) -> str:
    """The phase in a heartbeat value ("<count> <phase>")."""
    return value.split(" ", 1)[1] if " " in value else "(phase unknown)"


def exit_now(message: str, write_error_file: Callable[[str], None]) -> None:
    """End this process from a thread: ``message`` to the launcher's error file and stderr, then exit 1."""
    try:
        write_error_file(message)
        sys.stderr.write(f"vpp: {message}\n")  # the process ends here: its last word, not a report
        sys.stderr.flush()
    finally:
        os._exit(1)


__all__ = ["BEAT_S", "EXIT_GRACE_S", "SILENT_S", "Heartbeat", "exit_now"]
