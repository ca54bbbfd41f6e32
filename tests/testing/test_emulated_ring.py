"""Context parallelism's ring pass-KV on the emulated NCCL device (vpp.testing.emulated_ring): the real
cp_attention, real tensors, NCCL's ordering rules, a virtual timeline."""

import pytest

from vpp.testing import emulated_ring
from vpp.testing.emulated_device import EmulationError
from vpp.testing.emulated_ring import emulate_ring


def test_pass_kv_hides_every_transfer_behind_attention_with_no_host_wait():
    run = emulate_ring(cp=2, chunks=(64, 64, 64, 64), layers=2)
    assert run.receives == 16  # 4 chunks x 2 layers x (cp - 1) ring steps x 2 ranks
    assert run.recv_overlap_steady >= 0.9, run
    assert run.host_transfer_waits == [0, 0], run
    assert run.max_abs_error <= 1e-5, run


def test_a_ring_whose_host_waits_for_each_transfer_hides_nothing_and_the_measures_say_so():
    waiting = emulate_ring(cp=2, chunks=(64, 64, 64, 64), layers=2, host_waits=True)
    ring = emulate_ring(cp=2, chunks=(64, 64, 64, 64), layers=2)
    assert waiting.recv_overlap_steady < 0.1 and min(waiting.host_transfer_waits) > 0, waiting
    assert waiting.makespan_s > ring.makespan_s
    assert waiting.max_abs_error <= 1e-5


def test_a_block_read_before_its_receive_is_ordered_is_caught(monkeypatch):
    """Drop the stream ordering of the receive (keep only the bytes): the emulation refuses the read."""
    def unordered(self):
        with self.device.cond:
            self.device.cond.wait_for(lambda: self.op.peer_op is not None, self.device.timeout_s)
        return True
    monkeypatch.setattr(emulated_ring._Filled, "wait", unordered)
    with pytest.raises(EmulationError, match="before that receive is ordered"):
        emulate_ring(cp=2, chunks=(32, 32), layers=1, timeout_s=20)


@pytest.mark.parametrize("cp,chunks", [(3, (60, 64, 7)), (4, (64, 64, 30))])
def test_rings_of_more_ranks_and_ragged_chunks_are_exact_and_never_block_the_host(cp, chunks):
    run = emulate_ring(cp=cp, chunks=chunks, layers=1, streams="group")
    assert run.max_abs_error <= 1e-5 and set(run.host_transfer_waits) == {0}, run


@pytest.mark.parametrize("method", ["all-gather", "pass-q"])
def test_methods_the_emulation_does_not_model_are_refused(method):
    with pytest.raises(ValueError, match=method):
        emulate_ring(method=method)


@pytest.mark.parametrize("device", ["h100", "910c"])
def test_cp_groups_as_vpp_async_stages_keep_every_pipeline_receive_hidden(device):
    """CP x PP on the emulated device: each pipeline rank is one CP lane (CP rank i of every stage's group,
    sending its share to CP rank i of the next), stage times from ContextParallelCost (the ring's exposed
    part included, its inside emulated above). The real executor, VPP-Async on a V: no host wait on a
    transfer, steady receives in flight during compute, makespan the simulator's."""
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.perf.arch import Arch
    from vpp.perf.cp import ContextParallelCost
    from vpp.perf.hardware import get_device
    from vpp.perf.ops import Parallel
    from vpp.schedules import make_layout
    from vpp.schedules.runner import simulate
    from vpp.testing.emulated_run import emulate
    arch = Arch.from_config(TINY_CONFIGS["tiny-qwen"], name="tiny-qwen")
    layout = make_layout("v", arch.layers, 2)
    cost = ContextParallelCost(arch, get_device(device), layout, Parallel(act_bytes=4, weight_bytes=4, kv_bytes=4),
                               cp=2, ring="rule")
    sim = simulate("vpp-async", layout, [32768], cost, chunk_size=4096)
    run = emulate(sim.plan, cost, hidden=8, vocab=8)
    assert run.recv_overlap >= 0.9, run
    assert sum(c.host_transfer_waits for c in run.counters) == 0
    assert run.makespan_s == pytest.approx(sim.summary.makespan, rel=0.01)
