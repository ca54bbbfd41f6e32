"""Progress of a long prefill per rank: a line after the rank's computes (throttled, and after its last)
with the time left predicted from the chunk times measured so far (tau_k linear in k), fed by the
executor's ``computed`` hook (one process here)."""

from __future__ import annotations

import io

import torch

from vpp.cli.terminal import RankProgress
from vpp.models.toy import ToyStage
from vpp.parallel import ParallelGroups
from vpp.runtime import Pipeline


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_time_left_follows_the_measured_chunk_times_and_lines_are_throttled():
    out, clock = io.StringIO(), Clock()
    p = RankProgress("round 1/1 vpp", 0, {0: 1, 3: 2}, 4, every_s=10.0, clock=clock, stream=out)
    p.computed(0, 0, 0, 1.0)
    p.computed(0, 0, 1, 2.0)  # per layer: 1 + k seconds
    assert out.getvalue() == ""  # within 10 s of the start: quiet
    assert p.seconds_left() == (3 + 4) + 2 * (1 + 2 + 3 + 4)  # stage 0: chunks 2, 3; stage 3 (2 layers): all
    clock.now = 10.0
    p.computed(3, 0, 0, 2.0)
    assert out.getvalue() == ("  round 1/1 vpp: rank 0 stage 3 chunk 1/4 took 2.0 s; 5/8 computes left, "
                              "~25 s left here\n")
    for k in (2, 3):
        p.computed(0, 0, k, 1.0 + k)
    for k in (1, 2, 3):
        p.computed(3, 0, k, 2.0 * (1 + k))
    assert out.getvalue().splitlines()[-1].endswith("took 8.0 s; 0/8 computes left, ~0 s left here")  # the last
    quiet = RankProgress("short", 0, {0: 1}, 1, every_s=10.0, clock=Clock(), stream=out)
    quiet.computed(0, 0, 0, 0.5)
    assert len(out.getvalue().splitlines()) == 2  # a run shorter than every_s: nothing


def test_the_executor_tells_every_compute_of_its_rank():
    fed, out = [], io.StringIO()
    progress = RankProgress("run", 0, {0: 1, 1: 1}, 3, bar=fed.append, every_s=0.0, stream=out)
    pipe = Pipeline([ToyStage((0, 1), 2), ToyStage((1, 2), 2)], ParallelGroups.single())
    pipe.prefill(torch.arange(12), 4, schedule="vpp", progress=progress)
    assert fed == [1, 2, 3]  # chunks fed into stage 0
    assert sorted(progress.times) == [(s, k) for s in (0, 1) for k in range(3)]
    assert len(out.getvalue().splitlines()) == 6
