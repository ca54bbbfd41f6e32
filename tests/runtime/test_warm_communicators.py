"""Every communicator is set up before the first timed call (issue 33, item 6): each group's collective
one (TP, EP, DP, the pipeline group's, which carries the logits broadcast) and the pipeline pairs; each
set-up is preceded by a bounded meeting, so a peer that never arrives raises naming it instead of
leaving the rank inside a set-up nothing can interrupt."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import vpp.parallel.comm as comm
import vpp.runtime.watchdog as watchdog
from vpp.parallel.device import get_accelerator
from vpp.parallel.grid import GridSizes
from vpp.parallel.groups import Group, ParallelGroups
from vpp.runtime.device_order import warm_communicators
from vpp.runtime.watchdog import ExecutionError
from vpp.testing.emulated_device import MemoryStore

TP, EP, DP, PP, UP = (type(name, (), {})() for name in ("TP", "EP", "DP", "PP", "UP"))


def _groups(rank):  # 2 ranks that share every group (a fake grid: only the groups matter here)
    both = (0, 1)
    return ParallelGroups(GridSizes(2, pp=2), rank, Group(both, rank, pg=TP), Group(both, rank, pg=PP),
                          Group.single(rank), Group(both, rank, pg=EP), Group.single(rank), get_accelerator("cpu"),
                          torch.device("cpu"), pp_up=Group(both, rank, pg=UP))


class _PairOps:
    def __init__(self):
        self.posted = []

    def isend(self, x, peer, group):
        self.posted.append(("send", peer))
        return self

    def irecv(self, buf, peer, group):
        self.posted.append(("recv", peer))
        return self

    def order_after(self, work):
        pass


@pytest.fixture
def fake(monkeypatch):
    store, calls = MemoryStore(), []
    monkeypatch.setattr(watchdog, "default_store", lambda: store)
    monkeypatch.setattr(comm, "_STARTED", set())
    monkeypatch.setattr(comm.dist, "all_reduce", lambda t, group=None, **kw: calls.append(group))
    return calls


def test_every_groups_communicator_and_the_pairs_are_warmed(fake):
    ops = {0: _PairOps(), 1: _PairOps()}
    done = {}
    threads = [threading.Thread(target=lambda r=r: done.__setitem__(
        r, warm_communicators(_groups(r), {1 - r}, ops[r], timeout_s=10))) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert done[0] == done[1] == ["tp", "ep", "pp", "pp_up", "pairs"]
    assert {id(g) for g in fake} == {id(TP), id(EP), id(PP), id(UP)}
    assert sorted(ops[0].posted) == [("recv", 1), ("send", 1)]
    # the groups' first fused exchange needs no more set-up: first_call was made
    assert (id(PP), 0) in comm._STARTED and (id(TP), 0) in comm._STARTED


def test_a_peer_that_never_comes_is_named_within_the_timeout(fake):
    start = time.monotonic()
    with pytest.raises(ExecutionError, match=r"waited 0.5s at the tp communicator's set-up for global rank\(s\) \[1\]") as info:
        warm_communicators(_groups(0), {1}, _PairOps(), timeout_s=0.5)
    assert info.value.global_rank == 1 and time.monotonic() - start < 5
    assert fake == []  # never entered the set-up itself
