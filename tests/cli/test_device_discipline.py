"""Every tensor the runtime and the measurement code allocate lives on the rank's device, and ranks get
the backend that moves their device's tensors.

On CPU the rank's device is the CPU, so a tensor made without ``device=`` is not visibly wrong; the
guards make it visible: a fake pipeline whose device is ``meta`` (the probe of ``measure_transfer``
must be made there), and real gloo ranks whose *default* device is ``meta`` while they measure and run
a prefill (anything made without an explicit device lands on ``meta`` and breaks the transfer).
"""

from __future__ import annotations

import pytest
import torch

import vpp.cli.prefill_rounds as prefill_module
from vpp.parallel import GridSizes, Group, ParallelGroups, initialize_model_parallel, run_distributed
from vpp.parallel.device import Accelerator, accelerator_for_backend, get_accelerator
from vpp.parallel.spawn import check_device_count


class _Done:
    def wait(self):
        return True


def _pipeline_of_two(rank: int, device: torch.device) -> ParallelGroups:
    pp = Group(ranks=(0, 1), rank=rank)  # described only; the test replaces the transfers
    one = Group.single(rank)
    return ParallelGroups(GridSizes(2, pp=2), rank, tp=one, pp=pp, dp=one, ep=one, etp=one,
                          accelerator=get_accelerator("cpu"), device=device, pp_up=pp)


@pytest.mark.parametrize("rank", [0, 1])
def test_measure_transfer_probes_with_a_tensor_on_the_ranks_device(monkeypatch, rank):
    moved = []

    def transfer(buf, peer, group):
        moved.append((buf.device, tuple(buf.shape), buf.dtype))
        return _Done()
    monkeypatch.setattr(prefill_module, "isend", transfer)
    monkeypatch.setattr(prefill_module, "irecv", transfer)
    monkeypatch.setattr(prefill_module.dist, "broadcast_object_list", lambda box, src, group: None)
    meta = torch.device("meta")
    prefill_module.measure_transfer(_pipeline_of_two(rank, meta), 64, 32, torch.bfloat16, rounds=2)
    assert len(moved) == 2 * 3  # a send and a receive per round, one warm-up round
    assert set(moved) == {(meta, (64, 32), torch.bfloat16)}


def test_backend_and_device_kind_map_both_ways():
    assert [accelerator_for_backend(b).kind for b in ("gloo", "nccl", "hccl", "NCCL")] == ["cpu", "cuda", "npu", "cuda"]
    with pytest.raises(ValueError, match="process-group backend 'mpi' is not one of"):
        accelerator_for_backend("mpi")


def test_fewer_devices_than_ranks_is_a_clear_error():
    check_device_count(get_accelerator("cpu"), 64)  # CPU ranks share the host
    if torch.cuda.device_count() < 2:
        with pytest.raises(RuntimeError, match=r"2 ranks need one cuda device each, but \d (is|are) visible"):
            check_device_count(Accelerator("cuda", "nccl"), 2)


def _guarded_rank(rank, world, model):
    from vpp.models.registry import open_model, snap_partition
    from vpp.schedules import make_layout
    from vpp.runtime.api import forward_prefill
    groups = initialize_model_parallel(1, 2)
    facts = {"device": str(groups.device), "backend": groups.accelerator.backend}
    try:
        initialize_model_parallel(1, 2, accelerator=Accelerator("cuda", "nccl"))
    except ValueError as exc:
        facts["mismatch"] = str(exc)
    source = open_model(model)
    layout = make_layout("v", source.num_layers, 2, partition=snap_partition(source.num_layers, 4, source.stage_starts))
    stages = source.stages(layout, groups)
    ids = torch.randint(0, 2048, (40,), generator=torch.Generator().manual_seed(3))
    plain = forward_prefill(stages, ids if rank == 0 else None, 8, groups, schedule="vpp-async").logits
    for st in stages:
        st.release(0)
    with torch.device("meta"):  # anything made without an explicit device lands here
        facts["transfer_s"] = prefill_module.measure_transfer(groups, 8, stages[0].hidden_size, torch.float32)
        guarded = forward_prefill(stages, ids if rank == 0 else None, 8, groups, schedule="vpp-async").logits
    facts["same"] = None if plain is None else bool(guarded.device.type == "cpu" and torch.equal(plain, guarded))
    return facts


@pytest.mark.slow
def test_ranks_allocate_on_their_device_and_use_its_backend(worlds):
    results = worlds.run(2, _guarded_rank, "tiny-glm", timeout=240)
    for facts in results:
        assert facts["device"] == "cpu" and facts["backend"] == "gloo"
        assert "the process group runs 'gloo', but device 'cuda' needs 'nccl'" in facts["mismatch"]
        assert facts["transfer_s"] > 0
    assert [f["same"] for f in results] == [True, None]  # the V's last stage is on rank 0


def _never_called(rank, world):
    raise AssertionError("no rank should start")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_spawning_ranks_on_a_missing_accelerator_fails_before_any_process_starts():
    with pytest.raises(RuntimeError, match="device 'cuda' was asked for, but torch.cuda.is_available"):
        run_distributed(_never_called, 2, device="cuda")
