"""A group's first ``batch_isend_irecv`` must include every rank of the group (torch's documentation:
NCCL sets the communicator up in it), and ``all_to_all(impl="auto")`` picks one path on every rank
(issue 33, item 7). The fake records each rank's calls per group and enforces the first-call rule."""

from __future__ import annotations

import pytest
import torch

import vpp.parallel.comm as comm
from vpp.parallel.groups import Group


class FirstCallRule:
    """Records (rank, kind) per group; :meth:`check` raises where a group's first fused exchange left a
    rank out (no earlier collective that every rank made)."""

    def __init__(self):
        self.me, self.calls = None, {}

    def is_initialized(self):
        return True

    def get_backend(self, pg):
        return "nccl"

    def P2POp(self, op, tensor, peer, group=None):
        return (op, tensor, peer, group)

    def batch_isend_irecv(self, ops):
        self.calls.setdefault(id(ops[0][3]), []).append((self.me, "batch"))
        return [_Done() for _ in ops]

    def all_reduce(self, tensor, group=None, **kw):
        self.calls.setdefault(id(group), []).append((self.me, "collective"))

    def check(self, size):
        for pg, calls in self.calls.items():
            first = {}
            for rank, kind in calls:
                first.setdefault(rank, kind)
            if "batch" in first.values() and (set(first) != set(range(size)) or set(first.values()) != {"batch"}):
                raise RuntimeError(f"undefined: the group's first batch_isend_irecv left out ranks "
                                   f"{sorted(set(range(size)) - {r for r, k in first.items() if k == 'batch'})}")


class _Done:
    def wait(self):
        return True


@pytest.fixture
def fake(monkeypatch):
    f = FirstCallRule()
    for name in ("is_initialized", "get_backend", "P2POp", "batch_isend_irecv", "all_reduce"):
        monkeypatch.setattr(comm.dist, name, getattr(f, name))
    monkeypatch.setattr(comm, "_STARTED", set())
    return f


def test_a_rank_with_nothing_to_exchange_still_joins_the_groups_first_call(fake):
    pg = object()
    splits = [[0, 2, 0], [1, 0, 0], [0, 0, 0]]  # rank 2 sends and receives nothing
    for r in range(3):
        fake.me = r
        x = torch.zeros(sum(splits[r]), 2)
        comm._all_to_all_p2p(x, x.new_empty((sum(s[r] for s in splits), 2)), Group((0, 1, 2), r, pg=pg),
                             splits[r], [splits[j][r] for j in range(3)])
    assert sorted(r for r, k in fake.calls[id(pg)] if k == "collective") == [0, 1, 2]
    fake.check(3)
    before = len(fake.calls[id(pg)])
    fake.me = 0  # later calls: no more set-up collectives
    comm._all_to_all_p2p(torch.zeros(2, 2), torch.zeros(1, 2), Group((0, 1, 2), 0, pg=pg), [0, 2, 0], [0, 1, 0])
    assert [k for _, k in fake.calls[id(pg)][before:]] == ["batch"]


def test_auto_never_falls_back_on_one_ranks_error(monkeypatch):
    monkeypatch.setattr(comm.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(comm.dist, "get_backend", lambda pg: "nccl")

    def fails(*a, **kw):
        raise RuntimeError("NCCL error: unhandled system error")
    monkeypatch.setattr(comm.dist, "all_to_all_single", fails)
    monkeypatch.setattr(comm, "_all_to_all_p2p", lambda *a: pytest.fail("fell back to p2p on one rank's error"))
    with pytest.raises(RuntimeError, match="unhandled system error"):
        comm.all_to_all(torch.zeros(2, 1), Group((0, 1), 0, pg=object()), [1, 1], [1, 1], impl="auto")


def test_auto_picks_the_path_from_the_backend(monkeypatch):
    monkeypatch.setattr(comm.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(comm.dist, "get_backend", lambda pg: "custom")
    monkeypatch.setattr(comm.dist, "all_to_all_single", lambda *a, **kw: pytest.fail("native on a backend without it"))
    chosen = []
    monkeypatch.setattr(comm, "_all_to_all_p2p", lambda x, out, *a: chosen.append("p2p") or out)
    comm.all_to_all(torch.zeros(2, 1), Group((0, 1), 0, pg=object()), [1, 1], [1, 1], impl="auto")
    assert chosen == ["p2p"] and comm.native_all_to_all(Group((0, 1), 0, pg=object())) is False
