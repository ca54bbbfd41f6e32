"""The suite's persistent worlds (tests/worlds.py): many cases on ranks spawned once, a failing case
fails alone, a hung one is stopped and the world spawned anew, and closing leaves no process."""

import os
import time

import pytest
import torch
import torch.distributed as dist

from tests.worlds import LIVE, World
from vpp.parallel import RankFailure, initialize_model_parallel

pytestmark = pytest.mark.slow  # spawns ranks


def _case(rank, world, value):
    groups = initialize_model_parallel(1, world)
    t = torch.tensor([float(value + rank)])
    dist.all_reduce(t, group=groups.pp.pg)  # a subgroup this case made (destroyed after it)
    return os.getpid(), t.item(), torch.rand(1).item()


def _raise_on(rank, world, bad):
    if rank == bad:
        raise ValueError(f"planted on rank {rank}")
    return rank


def _hang_on(rank, world, bad):
    if rank == bad:
        time.sleep(3600)
    return rank


def test_cases_share_one_spawn_fail_alone_and_leave_nothing():
    world = World(2)
    try:
        first = world.run(_case, 1, timeout=60)
        second = world.run(_case, 5, timeout=60)
        assert [r[1] for r in first] == [3.0, 3.0] and [r[1] for r in second] == [11.0, 11.0]
        assert [r[0] for r in first] == [r[0] for r in second]  # the same processes
        assert [r[2] for r in first] == [r[2] for r in second]  # every case starts from the default seed
        with pytest.raises(RankFailure, match=r"rank 1 of 2 failed:\nValueError: planted on rank 1") as info:
            world.run(_raise_on, 1, timeout=60)
        assert info.value.rank == 1
        assert world.run(_raise_on, -1, timeout=60) == [0, 1] and world.spawns == 1  # the world carries on
        with pytest.raises(RankFailure, match=r"ranks \[0\] did not answer within 2s"):
            world.run(_hang_on, 0, timeout=2)
        assert not world.procs  # a hung world is stopped ...
        again = world.run(_case, 1, timeout=60)  # ... and the next case gets a fresh one
        assert world.spawns == 2 and {r[0] for r in again}.isdisjoint({r[0] for r in first})
        pids = {r[0] for r in again}
        assert pids <= LIVE
    finally:
        world.close()
    assert not pids & LIVE
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
