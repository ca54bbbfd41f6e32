"""The device path's watchdog thread (:class:`vpp.runtime.watchdog.WorkWatch`): it, not the rank's
thread, notices a transfer past its deadline or another rank's failure notice, and the rank's thread
raises it at its next check."""

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


def test_the_watchdog_thread_selects_the_device_before_it_queries():
    import threading
    local = threading.local()

    class _OnDevice(_Work):
        def is_completed(self):
            assert getattr(local, "device", None) == "cuda:3", "queried before set_device on this thread"
            return True

    dog = Watchdog("w4", 0, timeout_s=5, poll_s=0.01, pollable=True)
    watch = WorkWatch(dog, select_device=lambda: setattr(local, "device", "cuda:3"))
    watch.watch(_OnDevice(), "R0<1.r0.c0", 1)
    assert _until(lambda: watch.outstanding == 0)
    watch.check()
    watch.close()


def test_a_work_that_completed_with_an_error_is_reported_at_once_naming_its_peer():
    class _Failed(_Work):
        def exception(self):
            return RuntimeError("NCCL communicator was aborted on rank 5")

    dog = Watchdog("w5", 0, timeout_s=60, poll_s=0.01, pollable=True, global_ranks=(4, 5))
    watch = WorkWatch(dog)
    watch.watch(_Failed(done=True), "S0>1.r0.c2", 1)
    assert _until(lambda: watch.error is not None, limit=2.0)
    with pytest.raises(ExecutionError, match=r"gave up at S0>1.r0.c2: pipeline rank 1 stopped responding "
                                             r"\(RuntimeError: NCCL communicator was aborted") as info:
        watch.check()
    assert info.value.rank == 1 and info.value.global_rank == 5
    watch.close()


@pytest.mark.parametrize("path", ["is_completed raises", "completed with an error"])
def test_a_broken_transfer_reads_the_same_whichever_thread_sees_it_first(path):
    # gloo's "Connection closed by peer" may reach the watch thread before the rank's own wait (under load
    # it did): the rank's error must not depend on which one won
    error = RuntimeError("Connection closed by peer [127.0.0.1]:4242")

    class _Broken(_Work):
        def is_completed(self):
            if path == "is_completed raises":
                raise error
            return True

        def exception(self):
            return error

    dog = Watchdog("w6", 0, timeout_s=60, poll_s=0.01, pollable=True, global_ranks=(4, 5))
    class _Ended(_Work):  # the rank's own wait: done, and its wait() raises
        def wait(self):
            raise error

    with pytest.raises(ExecutionError) as own:
        dog.wait(_Ended(done=True), "R0<1.r0.c4", 1)
    watch = WorkWatch(dog)
    watch.watch(_Broken(), "R0<1.r0.c4", 1)
    assert _until(lambda: watch.error is not None, limit=2.0)
    with pytest.raises(ExecutionError) as seen:
        watch.check()
    watch.close()
    assert str(seen.value) == str(own.value) == ("pipeline rank 0 gave up at R0<1.r0.c4: pipeline rank 1 stopped "
                                                "responding (RuntimeError: Connection closed by peer [127.0.0.1]:4242)")
    assert (seen.value.rank, seen.value.global_rank) == (own.value.rank, own.value.global_rank) == (1, 5)


def test_abort_groups_uses_abort_then_shutdown_then_destroy(monkeypatch):
    import vpp.runtime.watchdog as wd
    done = []

    class Abortable:
        def abort(self):
            done.append("abort")

    class OnlyShutdown:
        def shutdown(self):
            done.append("shutdown")

    class Old:
        pass

    monkeypatch.setattr(wd.dist, "destroy_process_group", lambda pg: done.append("destroy"))
    a = Abortable()
    assert wd.abort_groups([a, a, None, OnlyShutdown(), Old()]) == ["abort", "shutdown", "destroy"]
    assert done == ["abort", "shutdown", "destroy"]


def _raising(exc):
    def start():
        raise exc
    return start


def test_a_post_to_a_peer_that_is_gone_reads_as_the_waits_error():
    # posting to a peer that already closed its connections raises at once, before any wait: the rank's
    # error must still say who stopped responding, as a failed wait says it
    dog = Watchdog("w7", 0, timeout_s=60, poll_s=0.01, global_ranks=(4, 5))
    dog.store = _Store()
    gone = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4242")
    with pytest.raises(ExecutionError) as info:
        dog.post(_raising(gone), "S0>1.r0.c3", 1)
    assert str(info.value) == ("pipeline rank 0 gave up at S0>1.r0.c3: pipeline rank 1 stopped responding "
                               f"(RuntimeError: {gone})")
    assert (info.value.rank, info.value.global_rank) == (1, 5) and info.value.__cause__ is gone
    assert dog.post(lambda: "work", "S0>1.r0.c3", 1) == "work"


def test_a_local_error_of_a_post_passes_unless_another_rank_failed_first():
    dog = Watchdog("w8", 0, timeout_s=60, poll_s=0.01, global_ranks=(4, 5))
    dog.store = _Store()
    local = RuntimeError("Tensors must be contiguous")
    with pytest.raises(RuntimeError) as info:
        dog.post(_raising(local), "R3<1.r0.c0", 1)
    assert info.value is local  # not blamed on the peer
    other = Watchdog("w8", 1, timeout_s=60, poll_s=0.01, global_ranks=(4, 5))
    other.store = dog.store
    other.notify_failure("pipeline rank 1 (global rank 5) raised ValueError: no caches while decoding", 5)
    with pytest.raises(ExecutionError) as info:
        dog.post(_raising(local), "decode output of stage 0", 1)
    assert str(info.value) == ("pipeline rank 0 gave up at decode output of stage 0: pipeline rank 1 (global rank 5) "
                               "raised ValueError: no caches while decoding")
    assert info.value.global_rank == 5
