"""Timeouts, faults and teardown as NCCL has them, on the emulated device (issue 33, items 2-4): a
healthy run with an idle gap between requests longer than ``timeout_s`` passes (a receive is posted
when its peer could send, so neither vpp's deadline nor the process group's own clock, which starts at
enqueue, runs during the gap); a rank that dies ends every other rank within the timeout, each naming
it, and each aborts its communicators; the watchdog thread selects the device before it queries."""

from __future__ import annotations

import time

import pytest

from vpp.schedules import strategies
from vpp.schedules.cost import LinearCost
from vpp.schedules.ir import chunk_requests
from vpp.schedules.layout import make_layout
from vpp.testing.emulated_device import EmulationError
from vpp.testing.emulated_run import EmulatedRun
from vpp.runtime.watchdog import ExecutionError

CHUNK = 64


def _plan(schedule, pp, lengths, arrivals=None):
    strategy = strategies.get(schedule)
    layout = make_layout(strategy.layout, 4 * pp, pp)
    return strategy.plan(layout, chunk_requests(lengths, CHUNK, arrivals=arrivals))


def _cost():
    return LinearCost.eq2(1e-3, CHUNK, seconds_per_token=1e-3 / CHUNK)


@pytest.mark.parametrize("schedule", ["cpp", "vpp-async"])
def test_an_idle_gap_longer_than_the_timeout_between_requests_passes(schedule):
    plan = _plan(schedule, 2, [2 * CHUNK, 2 * CHUNK], arrivals=[0.0, 1.2])
    start = time.monotonic()
    res = EmulatedRun(plan, _cost(), timeout_s=0.5).run()
    assert time.monotonic() - start >= 1.2 and set(res.logits) == {0, 1}


class _Killed(BaseException):
    """The rank's process is gone: no notice, no exception handler of the executor runs."""


def test_a_dead_rank_ends_every_other_rank_within_the_timeout_naming_it():
    run = EmulatedRun(_plan("cpp", 3, [4 * CHUNK]), _cost(), timeout_s=0.6)
    calls = []

    def dies(x, request, offset, last_token_only=False):
        calls.append(offset)
        if len(calls) == 2:
            raise _Killed()
        return type(run.stages[0][0]).forward(run.stages[0][0], x, request, offset, last_token_only)

    run.stages[0][0].forward = dies
    start = time.monotonic()
    with pytest.raises(EmulationError) as info:
        run.run()
    took = time.monotonic() - start
    errors = info.value.errors
    assert isinstance(errors[0], _Killed)
    for r in (1, 2):
        assert isinstance(errors[r], ExecutionError) and errors[r].global_rank == 0, (r, errors[r])
    assert took < 0.6 + 2.0, took  # the timeout, the blame grace and polling; never a hang
    assert run.device.aborted == {1, 2}  # every surviving rank tore its communicators down


def test_a_rank_slow_to_leave_the_start_is_not_broken_by_a_later_failure(monkeypatch):
    # Under load a rank released by the start barrier may wake only after another rank has already
    # failed; the failure must reach it as the executor's error naming the culprit, not as a broken
    # barrier. The slow wake is modelled as threading's own: released, then the state read on waking.
    import threading

    import vpp.testing.emulated_run as emulated_run

    class _SlowWake(threading.Barrier):
        def wait(self, timeout=None):
            index = super().wait(timeout)
            if threading.current_thread().name == "emulated-rank-2" and getattr(self, "_passes", 0) == 1:
                time.sleep(0.4)  # rank 0 dies meanwhile
                if self.broken:
                    raise threading.BrokenBarrierError
            self._passes = getattr(self, "_passes", 0) + (threading.current_thread().name == "emulated-rank-2")
            return index

    monkeypatch.setattr(emulated_run.threading, "Barrier", _SlowWake)
    run = EmulatedRun(_plan("cpp", 3, [4 * CHUNK]), _cost(), timeout_s=1.0)

    def dies(x, request, offset, last_token_only=False):
        raise _Killed()

    run.stages[0][0].forward = dies
    with pytest.raises(EmulationError) as info:
        run.run()
    errors = info.value.errors
    assert isinstance(errors[0], _Killed)
    for r in (1, 2):
        assert isinstance(errors[r], ExecutionError) and errors[r].global_rank == 0, (r, errors[r])


def test_a_watchdog_that_does_not_select_the_device_is_caught(monkeypatch):
    import vpp.runtime.executor as executor
    real = executor.WorkWatch
    monkeypatch.setattr(executor, "WorkWatch", lambda dog, select_device=None: real(dog))
    run = EmulatedRun(_plan("cpp", 2, [2 * CHUNK, 2 * CHUNK], arrivals=[0.0, 0.3]), _cost(), timeout_s=2.0)
    with pytest.raises(EmulationError, match="set the device first"):
        run.run()
