"""The watchdog's two ways of waiting, without a process group: on NCCL/HCCL ("pollable") it polls
``is_completed()`` and then calls ``wait()`` on the caller's own thread (so the caller's stream is the
one ordered after the transfer); a transfer that never completes trips the deadline; a failing
transfer names the peer."""

import threading

import pytest

from vpp.runtime.watchdog import ExecutionError, Watchdog


class _FakeWork:
    def __init__(self, polls_until_done=3, fail=False):
        self.left, self.fail, self.waited_on = polls_until_done, fail, None

    def is_completed(self):
        self.left -= 1
        return self.left < 0

    def wait(self):
        self.waited_on = threading.current_thread()
        if self.fail:
            raise RuntimeError("connection closed by peer")
        return True


def test_pollable_wait_runs_on_the_callers_thread():
    dog = Watchdog("t1", 0, timeout_s=5, poll_s=0.01, pollable=True)
    work = _FakeWork(polls_until_done=5)
    dog.wait(work, "R1<1.r0.c0", 1)
    assert work.waited_on is threading.current_thread() and work.left < 0


def test_threaded_wait_for_gloo_runs_elsewhere():
    dog = Watchdog("t2", 0, timeout_s=5, poll_s=0.01, pollable=False)
    work = _FakeWork()
    dog.wait(work, "R1<1.r0.c0", 1)
    assert work.waited_on is not threading.current_thread()
    dog.close()


def test_a_transfer_that_never_completes_trips_the_deadline():
    dog = Watchdog("t3", 0, timeout_s=0.2, poll_s=0.01, pollable=True)
    with pytest.raises(ExecutionError, match=r"timed out after 0.2s at R1<1.r0.c4 waiting for pipeline rank 1"):
        dog.wait(_FakeWork(polls_until_done=10**9), "R1<1.r0.c4", 1)


@pytest.mark.parametrize("pollable", [True, False])
def test_a_failed_transfer_names_the_peer(pollable):
    dog = Watchdog("t4", 0, timeout_s=5, poll_s=0.01, pollable=pollable)
    with pytest.raises(ExecutionError, match="pipeline rank 0 gave up at S0>1.r0.c1: pipeline rank 1 stopped responding") as info:
        dog.wait(_FakeWork(polls_until_done=0, fail=True), "S0>1.r0.c1", 1)
    assert info.value.rank == 1 and info.value.action == "S0>1.r0.c1"
    dog.close()
