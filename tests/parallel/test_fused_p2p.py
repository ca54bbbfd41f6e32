"""Exchanges in both directions are fused with ``batch_isend_irecv`` on NCCL/HCCL. The fake below
enforces NCCL's rule: a rank's separately posted point-to-point ops run one after another on its
stream, each a rendezvous with its counterpart, so a rank whose stream is blocked in a receive never
starts the send behind it; a ``batch_isend_irecv`` group runs as one unit. Each rank's calls are
recorded, then the fake "runs" them and reports a hang (or delivers the data)."""

import pytest
import torch

import vpp.parallel.comm as comm
from vpp.parallel.groups import Group


class FakeNccl:
    def __init__(self, backend="nccl"):
        self.backend, self.me, self.programs = backend, None, {}

    # --- the parts of torch.distributed that comm.py calls ---
    def is_initialized(self):
        return True

    def get_backend(self, pg):
        return self.backend

    def P2POp(self, op, tensor, peer, group=None):
        return ("send" if op == self.isend else "recv", tensor, peer)

    def _post(self, unit):
        self.programs.setdefault(self.me, []).append(unit)
        return _Work()

    def isend(self, tensor, dst, group=None, tag=0):
        return self._post([("send", tensor, dst)])

    def irecv(self, tensor, src, group=None, tag=0):
        return self._post([("recv", tensor, src)])

    def batch_isend_irecv(self, ops):
        self.programs.setdefault(self.me, []).append(list(ops))
        return [_Work() for _ in ops]

    # --- running the recorded programs under NCCL's rule ---
    def run(self):
        heads = {r: 0 for r in self.programs}

        def head(r):
            prog = self.programs.get(r, ())
            return prog[heads[r]] if heads.get(r, 0) < len(prog) else ()

        while any(heads[r] < len(p) for r, p in self.programs.items()):
            ready = [r for r in self.programs if head(r) and all(
                any(k2 != kind and p2 == r for k2, _, p2 in head(peer)) for kind, _, peer in head(r))]
            if not ready:
                raise RuntimeError(f"hang: ranks stuck at {heads}")
            for r in ready:  # a unit runs together with its counterparts at the peers' heads
                for kind, t, peer in head(r):
                    if kind == "recv":
                        t.copy_(next(x for k2, x, p2 in head(peer) if k2 == "send" and p2 == r))
            for r in ready:
                heads[r] += 1


class _Work:
    def wait(self):
        return True


@pytest.fixture
def fake(monkeypatch):
    f = FakeNccl()
    for name in ("is_initialized", "get_backend", "P2POp", "isend", "irecv", "batch_isend_irecv"):
        monkeypatch.setattr(comm.dist, name, getattr(f, name))
    monkeypatch.setattr(comm, "first_call", lambda group, device: None)  # the first-call rule: test_first_exchange.py
    return f


def test_a_two_way_exchange_is_one_fused_batch_on_nccl(fake):
    bufs = {}
    for r in (0, 1):
        fake.me = r
        bufs[r] = torch.zeros(3)
        comm.exchange([(torch.full((3,), float(r + 1)), 1 - r)], [(bufs[r], 1 - r)], Group((0, 1), r, pg=object()))
    assert [len(u) for u in fake.programs[0]] == [2]
    fake.run()
    assert bufs[0].tolist() == [2.0] * 3 and bufs[1].tolist() == [1.0] * 3


def test_separate_posts_hang_under_the_fakes_rule(fake, monkeypatch):
    monkeypatch.setattr(comm, "fuses_p2p", lambda group: False)  # the code before the fix
    for r in (0, 1):
        fake.me = r
        comm.exchange([(torch.ones(2), 1 - r)], [(torch.zeros(2), 1 - r)], Group((0, 1), r, pg=object()))
    with pytest.raises(RuntimeError, match="hang"):
        fake.run()


def test_point_to_point_all_to_all_on_nccl_with_uneven_splits(fake):
    size = 3
    splits = [[1, 2, 0], [2, 0, 1], [1, 1, 1]]  # splits[i][j]: rows rank i sends to rank j
    xs = {i: torch.arange(sum(splits[i]) * 2, dtype=torch.float32).reshape(-1, 2) + 100 * i for i in range(size)}
    outs = {}
    for r in range(size):
        fake.me = r
        outs[r] = comm._all_to_all_p2p(xs[r], xs[r].new_empty((sum(s[r] for s in splits), 2)),
                                       Group(tuple(range(size)), r, pg=object()),
                                       splits[r], [splits[j][r] for j in range(size)])
    assert all(len(fake.programs[r]) == 1 for r in range(size))  # one fused batch per rank
    fake.run()
    for r in range(size):  # independent reference: slice every sender's rows addressed to r
        want = torch.cat([torch.split(xs[j], splits[j])[r] for j in range(size)])
        assert torch.equal(outs[r], want)


def test_gloo_posts_receives_then_sends_separately(fake):
    fake.backend = "gloo"
    fake.me = 0
    comm.exchange([(torch.ones(2), 1)], [(torch.zeros(2), 1)], Group((0, 1), 0, pg=object()))
    assert [[k for k, _, _ in u] for u in fake.programs[0]] == [["recv"], ["send"]]
