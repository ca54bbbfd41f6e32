"""The hand-over's pair communicators are set up before any payload (issue 33, item 6): pair by pair in
one order on every rank, each after a bounded meeting of its two ranks. In process, with a fake
store and fake transfers; tests/kv/test_handover.py checks on real ranks that each pair's first
transfer is that one element."""

from __future__ import annotations

import threading

import pytest
import torch

from vpp.kv import handover
from vpp.kv.transfer_plan import Transfer
from vpp.runtime import watchdog as watchdog_module
from vpp.runtime.watchdog import ExecutionError, Watchdog


class _Work:
    def __init__(self, log, what):
        self.log, self.what = log, what


class _Dist:
    def __init__(self, log):
        self.log = log

    def isend(self, tensor, dst):
        self.log.append(("send", dst, tensor.numel()))
        return _Work(self.log, dst)

    def irecv(self, tensor, src):
        self.log.append(("recv", src, tensor.numel()))
        return _Work(self.log, src)


class _Dog:
    def __init__(self, log):
        self.log = log

    def wait(self, work, what, peer):
        self.log.append(("wait", peer))

    def post(self, start, what, peer):
        return start()

    complete = Watchdog.complete  # the real post-then-wait, over this fake's post and wait


def _transfer(src, dst, name="k"):
    return Transfer(src=src, dst=dst, name=name, dim=None, start=0, end=1, src_offset=0, dst_offset=0)


PLAN = [_transfer(0, 3), _transfer(0, 2), _transfer(0, 2, "v"), _transfer(1, 3), _transfer(2, 2)]


@pytest.mark.parametrize("me, expected", [
    (0, [("meet", (0, 2)), ("send", 2, 1), ("wait", 2), ("meet", (0, 3)), ("send", 3, 1), ("wait", 3)]),
    (3, [("meet", (0, 3)), ("recv", 0, 1), ("wait", 0), ("meet", (1, 3)), ("recv", 1, 1), ("wait", 1)]),
    (2, [("meet", (0, 2)), ("recv", 0, 1), ("wait", 0)]),  # 2 -> 2 moves nothing between ranks
])
def test_each_pair_meets_then_moves_one_element_in_one_order(monkeypatch, me, expected):
    log = []
    monkeypatch.setattr(handover, "dist", _Dist(log))
    monkeypatch.setattr(handover, "rendezvous", lambda what, rank, members, timeout_s: log.append(("meet", members)))
    pairs = handover.warm_pairs(PLAN, me, torch.device("cpu"), _Dog(log), timeout_s=5)
    assert log == expected
    assert pairs == [m for kind, m in (e[:2] for e in expected) if kind == "meet"]


class _Store:
    def __init__(self):
        self.keys = {}

    def set(self, key, value):
        self.keys[key] = value

    def check(self, keys):
        return all(k in self.keys for k in keys)


def test_a_pair_meeting_waits_for_its_own_peer_not_an_earlier_meeting(monkeypatch):
    """Global rank 1 met rank 2; rank 3's meeting with rank 1 must wait for rank 1 to come to *it*
    (a shared key for every pair starting at rank 1 let it pass at once)."""
    store = _Store()
    monkeypatch.setattr(watchdog_module, "default_store", lambda: store)
    monkeypatch.setattr(watchdog_module, "first_failure", lambda s: None)
    monkeypatch.setattr(watchdog_module, "_ROUNDS", {})
    peer = threading.Thread(target=watchdog_module.rendezvous, args=("pair 1->2", 2, (1, 2)), kwargs={"timeout_s": 5})
    peer.start()  # ranks 1 and 2 meet
    watchdog_module.rendezvous("pair 1->2", 1, (1, 2), timeout_s=5)
    peer.join()
    with pytest.raises(ExecutionError, match=r"global rank\(s\) \[1\], which never arrived") as info:
        watchdog_module.rendezvous("pair 1->3", 3, (1, 3), timeout_s=0.2, poll_s=0.01)
    assert info.value.global_rank == 1
