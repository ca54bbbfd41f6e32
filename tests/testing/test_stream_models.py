"""One stream per process group (NCCL initialised eagerly with ``device_id=``, and HCCL) and per rank, on
the emulated device (issue 33, item 5): detected on the process group, said once in one line with its
cost, and answered by batching each step's transfers; the emulation's new rules (collectives on the
compute stream with lazy set-up, a split step's views checked like their buffer)."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

import vpp.runtime.device_order as device_order
from vpp.schedules import strategies
from vpp.schedules.cost import LinearCost
from vpp.schedules.ir import chunk_requests
from vpp.schedules.layout import make_layout
from vpp.testing.emulated_device import EmulatedDevice, EmulationError
from vpp.testing.emulated_run import EmulatedRun

CHUNK = 1024


def _run(schedule, pp, streams, fuse=None, chunks=8):
    strategy = strategies.get(schedule)
    layout = make_layout(strategy.layout, 4 * pp, pp)
    per = 0.01 * pp / layout.num_stages
    cost = LinearCost.eq2(per, CHUNK, seconds_per_token=per / CHUNK)
    run = EmulatedRun(strategy.plan(layout, chunk_requests([chunks * CHUNK], CHUNK)), cost, streams=streams, fuse=fuse)
    batches = []
    for ops in run.ops:
        real = ops.batch
        ops.batch = lambda items, group, real=real: batches.append(len(items)) or real(items, group)
    return run.run(), batches


@pytest.mark.parametrize("streams", ["group", "rank"])
def test_one_stream_per_group_batches_each_steps_transfers_and_never_waits_on_the_host(streams):
    pair, none = _run("vpp-async", 4, "pair")
    fused, batches = _run("vpp-async", 4, streams)
    unfused, _ = _run("vpp-async", 4, streams, fuse=False)
    assert none == [] and batches and max(batches) >= 2  # steps with a send and a receive went as one batch
    for res in (fused, unfused):
        assert res.per_chunk("host_transfer_waits") == 0
    assert fused.makespan_s <= unfused.makespan_s + 1e-9
    assert fused.makespan_s == pytest.approx(pair.makespan_s, rel=1e-6)
    assert set(fused.logits) == set(pair.logits) == {0}


class _PG:
    pass


def test_one_stream_per_group_is_detected_on_the_process_group(monkeypatch):
    backend = {"b": "hccl"}
    monkeypatch.setattr(device_order.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(device_order.dist, "get_backend", lambda pg: backend["b"])
    default = _PG()
    default.bound_device_id = None
    monkeypatch.setattr(device_order.dist.distributed_c10d, "_get_default_group", lambda: default)
    assert "HCCL" in device_order.one_stream_per_group(_PG())
    backend["b"] = "nccl"
    assert device_order.one_stream_per_group(_PG()) is None  # lazy init: a communicator per pair
    default.bound_device_id = torch.device("cuda", 1)
    assert "device_id=cuda:1" in device_order.one_stream_per_group(_PG())
    assert device_order.one_stream_per_group(None) is None


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_the_serialising_setup_is_said_once_in_one_line(monkeypatch):
    from vpp.parallel.device import Accelerator
    from vpp.parallel.grid import GridSizes
    from vpp.parallel.groups import Group, ParallelGroups

    monkeypatch.setattr(device_order, "orders_on_device", lambda groups: True)
    monkeypatch.setattr(device_order, "one_stream_per_group", lambda pg: "HCCL runs a group's p2p on one stream")
    monkeypatch.setattr(device_order, "_SAID", set())
    monkeypatch.setattr(Accelerator, "module", lambda self: torch.cuda)
    pp = Group((0, 1), 0, pg=_PG())
    groups = ParallelGroups(GridSizes(2, pp=2), 0, Group.single(), pp, Group.single(), Group.single(),
                            Group.single(), Accelerator("npu", "hccl"), torch.device("cpu"), pp_up=pp)
    said = _Lines()  # on the logger itself: the suite's other tests may stop vpp's loggers propagating
    monkeypatch.setattr(device_order.log, "disabled", False)  # or disable them (logging.config), or raise
    monkeypatch.setattr(device_order.log, "level", logging.WARNING)  # their level: this logger says its line
    device_order.log.addHandler(said)
    try:
        first, second = device_order.stream_ops_for(groups), device_order.stream_ops_for(groups)
    finally:
        device_order.log.removeHandler(said)
    assert first.fuses and second.fuses
    lines = said.lines
    assert len(lines) == 1 and "\n" not in lines[0] and "makespan +" in lines[0] and "batch_isend_irecv" in lines[0]


def test_a_view_of_a_receive_buffer_is_checked_like_the_buffer():
    device = EmulatedDevice(2, LinearCost.eq2(0.01, CHUNK, seconds_per_token=1e-5))
    for r in (0, 1):
        device.select_device(r, host=True)
    device.warmed.add(("down", 0, 1))
    buf = torch.zeros(4, 2)
    device.post(1, "recv", buf, 0, "down", "recv 1<0")
    piece = torch.split(buf, [1, 3])[1]  # a split step's second piece: not the buffer object
    with pytest.raises(EmulationError, match="reads the buffer of recv 1<0"):
        device.compute(1, "F1.r1@0", 0.01, inputs=(piece,))


def test_a_collective_runs_on_the_compute_stream_and_its_first_call_sets_the_communicator_up():
    device = EmulatedDevice(2, LinearCost.eq2(0.01, CHUNK, seconds_per_token=1e-5))
    before = {r: device.compute(r, f"F{r}", 0.01 * (r + 1)) for r in (0, 1)}

    def calls(r):
        device.collective(r, "pp", (0, 1), "broadcast logits", 0.001)
        device.collective(r, "pp", (0, 1), "broadcast logits", 0.001)

    threads = [threading.Thread(target=calls, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert [c.host_transfer_waits for c in device.counters] == [1, 1]  # the lazy set-up, once per rank
    first = [next(op for op in device.ops if op.kind == "collective" and op.rank == r) for r in (0, 1)]
    assert {op.start for op in first} == {0.02}  # after both ranks' earlier compute: together, on the compute stream
    assert all(op.start >= before[op.rank].end for op in first)
