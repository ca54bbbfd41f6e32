"""The paper study's pieces on several processes (benchmarks/paper/jobs.py): the same results, in the
same order, as in one process (paper_repro's committed report is checked at the default, every CPU)."""

import pytest

from benchmarks.paper.jobs import default_jobs, pmap
from benchmarks.paper.sweep import sweep
from vpp.perf.arch import Arch
from vpp.perf.ops import Parallel
from vpp.perf.runs import Setup

from tests.perf.archs import DEV, TINY_MLA


def _square(x: int) -> int:
    return x * x


@pytest.mark.slow
def test_pmap_keeps_the_items_order():
    assert pmap(_square, range(7), jobs=3) == [x * x for x in range(7)] == pmap(_square, range(7), jobs=1)
    assert default_jobs() >= 1


@pytest.mark.slow
def test_a_sweep_on_two_processes_is_the_sweep_in_one():
    arch = Arch.from_config({**TINY_MLA, "num_hidden_layers": 4})
    setups = {"tiny": Setup(arch, DEV, Parallel(tp=2, weight_bytes=1), 2)}
    one = sweep(setups, ["cpp", "vpp-async"], [1024, 4096], [256, 512])
    two = sweep(setups, ["cpp", "vpp-async"], [1024, 4096], [256, 512], jobs=2)
    assert [(p.model, p.strategy, p.length, p.chunk) for p in one] == [
        ("tiny", s, n, c) for n in (1024, 4096) for c in (256, 512) for s in ("cpp", "vpp-async")]
    assert [(p.model, p.strategy, p.length, p.chunk, p.row) for p in two] == \
        [(p.model, p.strategy, p.length, p.chunk, p.row) for p in one]
