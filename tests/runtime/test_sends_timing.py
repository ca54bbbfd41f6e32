"""The executor's per-chunk bookkeeping without a process group: send buffers held only while their
send is in flight (NCCL/HCCL polling, gloo's helper thread), compute spans timed by device events with
one synchronisation per run, and the watchdog's wait strategy asked of the process group."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest
import torch

from vpp.runtime import watchdog as watchdog_module
from vpp.runtime.sends import SendQueue
from vpp.runtime.timing import ComputeTimer
from vpp.runtime.watchdog import ExecutionError, Watchdog, polls_completion


class _Action:
    def __init__(self, n):
        self.peer, self.n = 1, n

    def __str__(self):
        return f"S0>1.r0.c{self.n}"


class _PolledWork:
    """NCCL-like: is_completed() turns True once the test says the transfer is done."""

    def __init__(self):
        self.done = False

    def is_completed(self):
        return self.done

    def wait(self):
        return True


class _BlockingWork:
    """gloo-like: is_completed() is False until wait() ran; wait() blocks until released."""

    def __init__(self):
        self.released = threading.Event()
        self.waited = False

    def is_completed(self):
        return self.waited

    def wait(self):
        self.released.wait(10)
        self.waited = True
        return True


def _buffers(n):
    return [torch.zeros(4) for _ in range(n)]


def test_polled_sends_are_dropped_when_complete_and_their_buffers_freed():
    queue = SendQueue(Watchdog("s1", 0, timeout_s=5, pollable=True), pollable=True)
    works, refs = [], []
    for n, buf in enumerate(_buffers(40)):  # 40 chunks, at most 3 sends in flight at once
        work = _PolledWork()
        queue.post(work, buf, _Action(n))
        works.append(work)
        refs.append(weakref.ref(buf))
        del buf
        if n >= 2:
            works[n - 2].done = True  # the send posted two chunks ago has been received
        queue.sweep()
        assert queue.live == sum(not w.done for w in works) <= 2
    gc.collect()
    assert sum(r() is not None for r in refs) == 2  # only the buffers of the sends still in flight
    assert queue.max_live == 3  # bounded by the sends in flight, not by the 40 chunks
    for w in works:
        w.done = True
    waited = queue.finish(time.perf_counter)  # the two left: complete, so their waits return at once
    assert len(waited) <= 2 and queue.live == 0


def test_gloo_sends_are_dropped_by_the_helper_thread_as_each_completes():
    queue = SendQueue(Watchdog("s2", 0, timeout_s=5, poll_s=0.01, pollable=False), pollable=False)
    works = [_BlockingWork() for _ in range(30)]
    for n, (work, buf) in enumerate(zip(works, _buffers(30))):
        queue.post(work, buf, _Action(n))
        if n >= 1:
            works[n - 1].released.set()  # completes in posting order, one behind
        deadline = time.monotonic() + 5
        while queue.live > 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert queue.live <= 1
    assert queue.max_live <= 2
    works[-1].released.set()
    queue.finish(time.perf_counter)
    assert queue.live == 0 and all(w.waited for w in works)
    queue.close()


def test_a_send_that_never_completes_trips_the_deadline_at_the_end():
    queue = SendQueue(Watchdog("s3", 0, timeout_s=0.2, poll_s=0.01, pollable=False), pollable=False)
    work = _BlockingWork()
    queue.post(work, torch.zeros(1), _Action(7))
    with pytest.raises(ExecutionError, match=r"timed out after 0.2s at S0>1.r0.c7 waiting for pipeline rank 1"):
        queue.finish(time.perf_counter)
    work.released.set()
    queue.close()


class _FakeEvent:
    """A device event that records the host clock (so spans can be checked) and counts itself."""

    made = 0

    def __init__(self):
        _FakeEvent.made += 1
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def test_event_timing_synchronises_once_per_run_and_reproduces_the_spans():
    syncs = []
    t0 = time.perf_counter()
    timer = ComputeTimer(0, t0, events=_FakeEvent, synchronize=lambda: syncs.append(1))
    assert syncs == [1]  # the origin, at the start of the run
    host = []
    for chunk in range(20):
        mark = timer.begin()
        a = time.perf_counter()
        time.sleep(0.001)
        b = time.perf_counter()
        timer.end(mark, 0, 0, chunk)
        host.append((a - t0, b - t0))
    assert syncs == [1]  # nothing per chunk
    spans = timer.finish()
    assert syncs == [1, 1] and timer.mode == "device-events"
    assert [s.chunk for s in spans] == list(range(20))
    origin_offset = spans[0].start - host[0][0]  # the origin event was recorded just after t0
    for s, (a, b) in zip(spans, host):
        assert s.kind == "compute" and s.end - s.start >= b - a - 1e-4
        assert abs((s.start - a) - origin_offset) < 5e-3


def test_host_timing_without_events():
    timer = ComputeTimer(3, time.perf_counter())
    mark = timer.begin()
    timer.end(mark, 2, 1, 0)
    (span,) = timer.finish()
    assert (span.rank, span.stage, span.request, span.chunk, timer.mode) == (3, 2, 1, 0, "host")


def test_the_wait_strategy_is_asked_of_the_process_group(monkeypatch):
    asked = []
    monkeypatch.setattr(watchdog_module.dist, "is_initialized", lambda: True)

    def backend(pg):
        asked.append(pg)
        return {"a": "nccl", "b": "hccl", "c": "gloo"}[pg]
    monkeypatch.setattr(watchdog_module.dist, "get_backend", backend)
    assert [polls_completion(pg) for pg in "abc"] == [True, True, False]
    assert asked == ["a", "b", "c"]
    assert polls_completion(None) is False  # a pipeline of one rank has no transfers
