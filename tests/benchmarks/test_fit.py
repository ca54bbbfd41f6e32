"""The fit of the two efficiencies the published figures do not give (benchmarks.paper.fit)."""

import pytest

from benchmarks.paper.fit import fit_cpp
from vpp.perf.arch import Arch
from vpp.perf.configs import get_config
from vpp.perf.hardware import ASCEND_910C
from vpp.perf.ops import Parallel
from vpp.perf.runs import Setup, run


def test_fit_recovers_known_efficiencies():
    """A CPP row simulated with eff_attn = 0.3 and eff_link = 0.4 is the target; fitting from other
    efficiencies must find those two again (the fit inverts the simulator, whatever the targets)."""
    arch = Arch.from_config(get_config("deepseek"))
    truth = Setup(arch, ASCEND_910C.replace(eff_attn=0.3, eff_link=0.4), Parallel(tp=8, weight_bytes=1))
    row = run(truth, "cpp", [131072], 16384).row
    start = Setup(arch, ASCEND_910C.replace(eff_attn=0.8, eff_link=0.9), Parallel(tp=8, weight_bytes=1))
    fitted, fit = fit_cpp(start, length=131072, chunk=16384,
                          target={"compute": row.compute, "exposed_comm": row.exposed_comm})
    assert fitted.device.eff_attn == pytest.approx(0.3, rel=1e-3)
    assert fitted.device.eff_link == pytest.approx(0.4, rel=1e-3)
