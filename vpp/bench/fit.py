"""Fitting the two device efficiencies the published figures do not give, on the paper's CPP rows only.

* ``eff_attn`` (achieved share of peak in attention kernels) is set so that the simulated CPP run's
  computation (per rank, the paper's definition, :mod:`.decompose`) equals the paper's CPP computation;
* ``eff_link`` (achieved share of link bandwidth in collectives) so that its exposed communication
  equals the paper's CPP exposed communication.

Nothing is fitted to DCPP or VPP rows: those are predictions. Both targets are monotone in their
constant, so a bisection on a log scale finds them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import paper
from vpp.perf.runs import Setup, run


@dataclass
class Fit:
    eff_attn: float
    eff_link: float
    target: dict
    achieved: dict

    def describe(self) -> str:
        t, a = self.target, self.achieved
        return (f"eff_attn = {self.eff_attn:.4f} (CPP computation {a['compute']:.2f} s vs paper {t['compute']:.2f} s); "
                f"eff_link = {self.eff_link:.4f} (CPP exposed comm. {a['exposed_comm']:.2f} s vs paper "
                f"{t['exposed_comm']:.2f} s)")


def _bisect(f, target: float, lo: float, hi: float, *, decreasing: bool, iters: int = 50) -> float:
    """x in [lo, hi] with f(x) = target, f monotone; searched on a log scale."""
    a, b = math.log(lo), math.log(hi)
    for _ in range(iters):
        m = (a + b) / 2
        v = f(math.exp(m))
        if (v > target) == decreasing:
            a = m
        else:
            b = m
    return math.exp((a + b) / 2)


def fit_cpp(setup: Setup, *, length: int = 524288, chunk: int = 24576, target: dict | None = None) -> tuple[Setup, Fit]:
    """A copy of ``setup`` whose device has ``eff_attn`` and ``eff_link`` fitted to the CPP row."""
    target = target or paper.TABLE_512K["cpp"]

    def with_dev(**kw) -> Setup:
        return Setup(setup.arch, setup.device.replace(**kw), setup.par, setup.pp, setup.dcpp_variant)

    def compute_at(eff: float) -> float:
        return run(with_dev(eff_attn=eff), "cpp", [length], chunk).row.compute

    eff_attn = _bisect(compute_at, target["compute"], 1e-3, 1.0, decreasing=True)

    def exposed_at(eff: float) -> float:
        return run(with_dev(eff_attn=eff_attn, eff_link=eff), "cpp", [length], chunk).row.exposed_comm

    eff_link = _bisect(exposed_at, target["exposed_comm"], 1e-4, 1.0, decreasing=True)
    fitted = with_dev(eff_attn=eff_attn, eff_link=eff_link)
    row = run(fitted, "cpp", [length], chunk).row
    achieved = {"compute": row.compute, "bubble": row.bubble, "exposed_comm": row.exposed_comm, "total": row.total}
    return fitted, Fit(eff_attn, eff_link, dict(target), achieved)
