"""DCPP's step-count table (benchmarks.paper.dcpp_steps): its adopted row is the step count the
simulated runs use (vpp.perf.runs, an independent path through the same planner)."""

from benchmarks.paper import dcpp_steps as PDS
from vpp.perf.arch import Arch
from vpp.perf.ops import Parallel
from vpp.perf.runs import Setup, run

from tests.perf.archs import DEV, TINY_MLA


def test_adopted_row_is_the_runs_step_count(monkeypatch):
    monkeypatch.setattr(PDS, "CELLS", ((16384, 2048), (32768, 4096)))
    setup = Setup(Arch.from_config({**TINY_MLA, "num_hidden_layers": 4}), DEV, Parallel(tp=2, weight_bytes=1), 2)
    rows = PDS.table(setup)
    assert rows[0][2:] == [run(setup, "dcpp", [L], B).row.chunks for L, B in PDS.CELLS]
    offline = setup.replace(dcpp_online=False)
    assert rows[-1][2:] == [run(offline, "dcpp", [L], B).row.chunks for L, B in PDS.CELLS]
    assert len(rows) == len(PDS.variants(1)) and all(isinstance(n, int) and n >= 1 for r in rows for n in r[2:])
