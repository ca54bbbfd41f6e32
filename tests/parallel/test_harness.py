"""The multi-process harness: results come back, failures surface promptly with the traceback."""

import os
import time

import pytest
import torch
import torch.distributed as dist

from vpp.parallel import RankFailure, run_distributed

pytestmark = pytest.mark.slow  # every test here starts processes


def _sum_of_ranks(rank, world_size, scale):
    x = torch.tensor([float(rank)])
    dist.all_reduce(x)
    return (rank, x.item() * scale, torch.get_num_threads())


def _raises_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("planted failure on rank one")
    dist.barrier()  # rank 0 waits here forever: the harness must not
    return rank


def _dies_on_rank_one(rank, world_size):
    if rank == 1:
        os._exit(7)
    dist.barrier()
    return rank


def _hangs(rank, world_size, marker):
    with open(f"{marker}{rank}", "w") as f:
        f.write(repr(time.time()))
    time.sleep(60)


def test_values_come_back_in_rank_order_with_one_thread_each():
    out = run_distributed(_sum_of_ranks, 3, 10.0, timeout=60)
    assert out == [(0, 30.0, 1), (1, 30.0, 1), (2, 30.0, 1)]


def test_a_rank_that_raises_fails_the_call_with_its_traceback_promptly():
    start = time.monotonic()
    with pytest.raises(RankFailure, match="rank 1 of 2 failed") as info:
        run_distributed(_raises_on_rank_one, 2, timeout=60)
    assert info.value.rank == 1
    assert "planted failure on rank one" in str(info.value)
    assert "_raises_on_rank_one" in str(info.value)  # the traceback names the function
    assert time.monotonic() - start < 45  # far inside the timeout: not a hang


def test_a_rank_that_dies_fails_the_call():
    with pytest.raises(RankFailure, match="rank 1 exited with code 7") as info:
        run_distributed(_dies_on_rank_one, 2, timeout=60)
    assert info.value.rank == 1


def test_a_hanging_rank_times_out(tmp_path):
    """The 3 s count from when the ranks run (start-up under load may take longer than that)."""
    with pytest.raises(RankFailure, match="timed out after 3s of running"):
        run_distributed(_hangs, 2, str(tmp_path / "running"), timeout=3)
    ran = max(float(p.read_text()) for p in tmp_path.glob("running*"))
    assert time.time() - ran < 3 + 15  # the timeout, then stopping the ranks


def test_start_up_has_its_own_allowance(tmp_path):
    """A timeout shorter than the ranks' start-up does not fail a run that finishes within it."""
    out = run_distributed(_sum_of_ranks, 2, 1.0, timeout=2.0)
    assert [o[1] for o in out] == [1.0, 1.0]
