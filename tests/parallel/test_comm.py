"""Communication verbs on CPU/gloo: TP region verbs, all-to-all (native and the p2p fallback),
pipeline p2p that cannot deadlock, and the groups built by initialize_model_parallel."""

import os
import subprocess
import sys

import pytest
import torch

from vpp.parallel import (
    all_to_all, exchange, gather_from_tp, initialize_model_parallel, irecv, isend, reduce_from_tp,
    scatter_to_tp,
)
from vpp.parallel.comm import exchange_counts
from vpp.parallel.device import get_accelerator, npu_available
from vpp.parallel.groups import Group


def _tp_verbs(rank, world_size):
    g = initialize_model_parallel(world_size).tp
    x = torch.arange(6.0).reshape(2, 3) + 10 * rank
    total = sum(torch.arange(6.0).reshape(2, 3) + 10 * r for r in range(world_size))
    assert torch.equal(reduce_from_tp(x.clone(), g), total)
    gathered = gather_from_tp(x, g, dim=-1)
    assert torch.equal(gathered, torch.cat([torch.arange(6.0).reshape(2, 3) + 10 * r for r in range(world_size)], -1))
    assert torch.equal(scatter_to_tp(gathered, g, dim=-1), x)
    return True


def _all_to_all_both_ways(rank, world_size):
    g = initialize_model_parallel(world_size).tp
    # rank r sends (r + j + 1) rows to rank j, each row filled with 100*r + j
    in_splits = [rank + j + 1 for j in range(world_size)]
    out_splits = [r + rank + 1 for r in range(world_size)]
    x = torch.cat([torch.full((n, 2), 100.0 * rank + j) for j, n in enumerate(in_splits)])
    expected = torch.cat([torch.full((n, 2), 100.0 * r + rank) for r, n in enumerate(out_splits)])
    native = all_to_all(x, g, in_splits, out_splits, impl="native")
    fallback = all_to_all(x, g, in_splits, out_splits, impl="p2p")
    assert torch.equal(native, expected) and torch.equal(fallback, expected)
    counts = exchange_counts(torch.tensor(in_splits), g)
    assert counts.tolist() == out_splits
    return True


def _both_send_first(rank, world_size):
    groups = initialize_model_parallel(1, world_size)
    peer = 1 - rank
    mine = torch.full((1000,), float(rank))
    buf = torch.empty(1000)
    # Both ranks list their send first: exchange posts receives first, so this cannot deadlock.
    exchange(sends=[(mine, peer)], recvs=[(buf, peer)], group=groups.pp)
    assert torch.equal(buf, torch.full((1000,), float(peer)))
    # Raw handles on the two directional channels, both sides sending first.
    out = torch.empty(8)
    send = isend(torch.full((8,), 7.0 + rank), peer, groups.pp_channel(rank, peer))
    recv = irecv(out, peer, groups.pp_channel(peer, rank))
    send.wait()
    recv.wait()
    assert torch.equal(out, torch.full((8,), 7.0 + peer))
    return groups.pp_channel(0, 1).pg is not groups.pp_channel(1, 0).pg


def _grid_on_four(rank, world_size):
    groups = initialize_model_parallel(2, 2, 2)
    return (groups.tp.ranks, groups.pp.ranks, groups.ep.ranks, groups.tp.rank, groups.pp.rank)


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3])
def test_tp_verbs(world, worlds):
    assert all(worlds.run(world, _tp_verbs, timeout=60))


@pytest.mark.slow
def test_all_to_all_native_and_fallback_agree_on_uneven_splits(worlds):
    assert all(worlds.run(3, _all_to_all_both_ways, timeout=60))


@pytest.mark.slow
def test_two_ranks_that_both_send_first_do_not_deadlock(worlds):
    # separate directional groups exist (the V's two comm groups)
    assert all(worlds.run(2, _both_send_first, timeout=60))


@pytest.mark.slow
def test_initialize_model_parallel_places_ranks_on_the_grid(worlds):
    out = worlds.run(4, _grid_on_four, timeout=60)
    assert out[0] == ((0, 1), (0, 2), (0, 1), 0, 0)
    assert out[3] == ((2, 3), (1, 3), (2, 3), 1, 1)


def test_p2p_refuses_self_and_out_of_range_peers():
    g = Group(ranks=(4, 5), rank=0)
    with pytest.raises(ValueError, match="peer 2 outside a group of 2"):
        isend(torch.zeros(1), 2, g)
    with pytest.raises(ValueError, match="rank 0 cannot send to or receive from itself"):
        irecv(torch.zeros(1), 0, g)


def test_cpu_is_chosen_without_torch_npu():
    acc = get_accelerator()
    if not npu_available() and not torch.cuda.is_available():
        assert (acc.kind, acc.backend) == ("cpu", "gloo")
    with pytest.raises(ValueError, match="unknown device kind 'tpu'"):
        get_accelerator("tpu")
    if not npu_available():
        with pytest.raises(RuntimeError, match="torch_npu is not importable"):
            get_accelerator("npu")


@pytest.mark.slow
def test_torchrun_env_init(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from vpp.parallel import init_distributed, initialize_model_parallel, reduce_from_tp\n"
        "init_distributed()\n"
        "g = initialize_model_parallel(2)\n"
        "x = reduce_from_tp(torch.ones(1), g.tp)\n"
        "assert x.item() == 2.0, x\n"
        f"open(r'{tmp_path}/rank%d' % dist.get_rank(), 'w').write('ok')\n"
        "dist.destroy_process_group()\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "rank0").read_text() == "ok" and (tmp_path / "rank1").read_text() == "ok"
