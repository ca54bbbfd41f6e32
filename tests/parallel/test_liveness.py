"""Heartbeats (vpp.parallel.liveness) on an in-process TCP store, with beats of milliseconds: a rank
whose heartbeat stops is announced dead by the rank watching it, naming its phase; a rank that finished
is not; and a rank still running after a recorded failure is ended. No process is started: a "rank"
here is a Heartbeat whose thread is stopped without :meth:`finish`, as a killed process's would be."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from vpp.parallel.liveness import Heartbeat
from vpp.parallel.rendezvous import announce_failure, first_failure

# beats of milliseconds; silence long against a beat, so that a thread held up on a loaded machine is not taken for dead
FAST = {"beat_s": 0.02, "silent_s": 1.5, "exit_grace_s": 0.3}
WAIT_S = 30.0  # generous: a loaded machine may hold a thread for a while; no assertion on time


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield dist.TCPStore("127.0.0.1", server.port, is_master=False)


def _ranks(store, world: int, exits: list) -> list[Heartbeat]:
    beats = [Heartbeat(announce_failure, first_failure, exits.append, **FAST) for _ in range(world)]
    for r, b in enumerate(beats):
        b.phase = f"in phase {r}"
        b.start(store.clone(), "test-alive", r, world)
    return beats


def _kill(beat: Heartbeat) -> None:
    """The rank's process died: its thread stops, nothing is written."""
    beat._stop.set()
    beat._thread.join()


def _until(predicate) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_rank_whose_heartbeat_stops_is_announced_dead_with_its_phase(store):
    exits: list[str] = []
    beats = _ranks(store, 3, exits)
    beats[1].phase = "while loading"
    _kill(beats[1])
    _until(lambda: first_failure(store) is not None)
    rank, message = first_failure(store)
    assert rank == 1 and message.startswith("global rank 1 died while loading (no heartbeat for "), message
    _until(lambda: len(exits) == 2)  # the living ranks 0 and 2 were still running after the grace
    assert len(exits) == 2 and all(m.endswith(message) for m in exits), exits
    for b in (beats[0], beats[2]):
        b.finish()


def test_a_rank_that_finished_is_not_dead_and_the_watch_moves_on(store):
    """Rank 1 finishes, then rank 2 dies: rank 0, which watched rank 1, now watches rank 2 and names it.
    Rank 1's key has stood still the longest, so a watcher that took a finished rank for a dead one
    would name rank 1 first (and nobody would name rank 2: rank 1 watched it)."""
    exits: list[str] = []
    beats = _ranks(store, 3, exits)
    beats[1].finish()
    _kill(beats[2])
    _until(lambda: first_failure(store) is not None)
    assert first_failure(store)[0] == 2
    beats[0].finish()


def test_the_first_failure_stays(store):
    assert announce_failure(store, 3, "global rank 3 raised ValueError: x") == (3, "global rank 3 raised ValueError: x")
    assert announce_failure(store, 1, "global rank 1 died") == (3, "global rank 3 raised ValueError: x")
    prefixed = dist.PrefixStore("0/", store)  # a process group's store reads the same key
    assert first_failure(prefixed) == (3, "global rank 3 raised ValueError: x")


def test_a_phase_change_is_written_at_once(store):
    beat = Heartbeat(announce_failure, first_failure, lambda m: None, beat_s=60.0)  # no beat of its own meanwhile
    beat.start(store.clone(), "test-alive", 0, 2)
    beat.phase = "while creating the process group"
    assert store.get("test-alive/0").decode().endswith(" while creating the process group")
    done = threading.Thread(target=beat.finish)
    done.start()
    done.join(WAIT_S)
    assert store.get("test-alive/0") == b"done"


def test_after_a_lost_transfer_the_rank_whose_heartbeat_stands_still_is_named(store):
    exits: list[str] = []
    beats = _ranks(store, 3, exits)
    beats[1].phase = "while loading"
    _kill(beats[1])
    rank, message = beats[0].silent_peer()
    assert rank == 1 and message.startswith("global rank 1 died while loading (no heartbeat for "), message
    for b in (beats[0], beats[2]):
        b.finish()
