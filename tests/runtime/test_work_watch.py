"""The device path's watchdog thread (:class:`vpp.runtime.watchdog.WorkWatch`): it, not the rank's
thread, notices a transfer past its deadline or another rank's failure notice, and the rank's thread
raises it at its next check."""

import threading
import time

import pytest

from vpp.runtime.watchdog import ExecutionError, Watchdog, WorkWatch


class _Work:
    def __init__(self, done=False):
        self.done = done

    def is_completed(self):
        return self.done


class _Store:
    def __init__(self):
        self.data = {}

    def check(self, keys):
        return all(k in self.data for k in keys)

    def get(self, key):
        return self.data[key]

    def compare_set(self, key, expected, value):
        self.data.setdefault(key, value.encode())


def _until(cond, limit=5.0):
    end = time.monotonic() + limit
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


def test_a_transfer_past_its_deadline_is_named_by_the_watchdog_thread():
    dog = Watchdog("w1", 0, timeout_s=0.2, poll_s=0.01, pollable=True, global_ranks=(4, 5))
    watch = WorkWatch(dog)
    watch.watch(_Work(done=True), "S0>1.r0.c0", 1)
    watch.watch(_Work(), "R2<1.r0.c3", 1)
    assert _until(lambda: watch.error is not None)
    with pytest.raises(ExecutionError, match=r"timed out after 0.2s at R2<1.r0.c3 waiting for pipeline rank 1") as info:
        watch.check()
    assert info.value.rank == 1 and info.value.global_rank == 5
    watch.close()


def test_completed_work_is_dropped_and_no_fault_is_raised():
    dog = Watchdog("w2", 0, timeout_s=0.2, poll_s=0.01, pollable=True)
    watch = WorkWatch(dog)
    work = _Work()
    watch.watch(work, "R0<1.r0.c0", 1)
    work.done = True
    assert _until(lambda: watch.outstanding == 0)
    time.sleep(0.3)
    watch.check()
    watch.close()
    assert not watch._thread.is_alive()


def test_a_failure_notice_from_another_rank_stops_this_one():
    dog = Watchdog("w3", 0, timeout_s=60, poll_s=0.01, pollable=True)
    dog.store = _Store()
    watch = WorkWatch(dog)
    watch.watch(_Work(), "R2<1.r0.c1", 1)
    other = Watchdog("w3", 1, timeout_s=60, poll_s=0.01, pollable=True)
    other.store = dog.store
    other.notify_failure("pipeline rank 1 (global rank 1) raised RuntimeError: boom at step 3 (F2.r0.c1)")
    assert _until(lambda: watch.error is not None)
    with pytest.raises(ExecutionError, match="pipeline rank 0 stopped at R2<1.r0.c1 because pipeline rank 1"):
        watch.check()
    watch.close()
