"""How much the paper reproduction's score leans on its ASSUMED constants (the ones neither sourced
from a datasheet nor fitted).

    python -m benchmarks.paper_sensitivity [--out benchmarks/results] [--quick]

The model of benchmarks/paper_repro.py has three fitted constants (eff_attn, eff_link, host_step) and
four assumed ones: the achieved share of peak in GEMMs (``eff_matmul`` 0.7) and in copies (``eff_mem``
0.8), 10 us per collective step (``link_latency``) and 10 us per kernel launch (``kernel_overhead``).
Each row here halves or doubles one assumed constant (a share of peak is capped at 1), REFITS the three
fitted constants on their cells as paper_repro does, reruns every model cell (512K tables, step counts,
the sweep, the ablation, the request streams as ``--quick`` runs them) and scores the cells that
paper_repro scores as predicted, with paper_repro's statuses (a cell's status is not recomputed per
row). What a row shows: the predicted cells within tolerance, the 512K totals against Table 1 / 2, and
which cells went in or out against the adopted model. ``--quick`` runs the adopted model and one
variant (the suite's smoke run); ``--statuses paper_repro.json`` takes the
predicted cells from a paper_repro run instead of recomputing them. Writes paper_sensitivity.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchmarks._report import md_table
from benchmarks.paper_repro import STRATS, model_cells, scored_cells, table_512k
from benchmarks.paper_streams import streams
from benchmarks import paper_cells as PC
from benchmarks.paper import published as paper
from benchmarks.paper.sweep import fitted_setups, sweep
from vpp.perf.hardware import ASCEND_910C

ASSUMED = ("eff_matmul", "eff_mem", "link_latency", "kernel_overhead")
SHARES = ("eff_matmul", "eff_mem")          # capped at 1
FACTORS = (0.5, 2.0)
TOTALS = (("cpp", "cpp"), ("dcpp", "dcpp"), ("vpp-async", "vpp"))   # (model strategy, paper column)


def variants(quick: bool) -> list[tuple[str, dict]]:
    """(label, device changes); the adopted model first."""
    out = [("adopted", {})]
    for name in ASSUMED[:1] if quick else ASSUMED:
        base = getattr(ASCEND_910C, name)
        for f in FACTORS[:1] if quick else FACTORS:
            v = base * f
            if name in SHARES:
                v = min(v, 1.0)
            if v != base:
                out.append((f"{name} x{f:g}", {name: v}))
    return out


def evaluate(changes: dict, predicted: set) -> dict:
    """Refit, rerun and score one device variant; ``predicted`` = the keys paper_repro scores as predicted."""
    setups, fit = fitted_setups(ASCEND_910C.replace(**changes))
    points = sweep(setups, list(STRATS), paper.LENGTHS, paper.CHUNKS)
    cells = model_cells(setups, points) + PC.stream_cells(streams(setups, True))
    scored = [c for c in cells if c.key in predicted]
    totals = {s: r.row.total for s, r in table_512k(setups).items()}
    return {"fit": {"eff_attn": fit.eff_attn, "eff_link": fit.eff_link, "host_step": fit.host_step},
            "within": sorted(f"{c.section}: {c.row}" for c in scored if c.within),
            "scored": len(scored),
            "totals_error": {s: totals[s] / paper.TABLE_512K[p]["total"] - 1 for s, p in TOTALS},
            "order_holds": totals["vpp-async"] < totals["cpp"] < totals["dcpp"]}


def adopted_predicted() -> set:
    """The keys of the cells paper_repro scores as predicted (statuses from moving each fitted constant)."""
    setups, _ = fitted_setups()
    points = sweep(setups, list(STRATS), paper.LENGTHS, paper.CHUNKS)
    cells, _ = scored_cells(setups, points, streams(setups, True))
    return {c.key for c in cells if c.status == "predicted" and c.within is not None}


def statuses_from(path: str) -> set:
    """The predicted, scored cells' keys in a paper_repro.json."""
    with open(path) as f:
        return {(c["section"], c["row"]) for c in json.load(f)["cells"]
                if c["status"] == "predicted" and c["within"] is not None}


def report(rows: list[tuple[str, dict, dict]]) -> str:
    base = set(rows[0][2]["within"])
    body = []
    for label, changes, r in rows:
        got = set(r["within"])
        fit = r["fit"]
        body.append([label, ", ".join(f"{k} = {v:g}" for k, v in changes.items()) or "as in paper_repro",
                     f"{fit['eff_attn']:.3f} / {fit['eff_link']:.3f} / {1e3 * fit['host_step']:.1f} ms",
                     f"{len(got)} of {r['scored']}",
                     " / ".join(f"{100 * r['totals_error'][s]:+.1f}%" for s, _ in TOTALS),
                     "yes" if r["order_holds"] else "NO",
                     "; ".join(sorted(got - base)) or "-", "; ".join(sorted(base - got)) or "-"])
    n0 = len(base)
    better = [(label, len(r["within"])) for label, _, r in rows[1:] if len(r["within"]) > n0]
    verdict = (f"No variant in this table puts more predicted cells within than the adopted model "
               f"({n0} of {rows[0][2]['scored']}): the cells a row gains it pays for with others."
               if not better else "More predicted cells within than the adopted model's " + str(n0) + ": "
               + ", ".join(f"{label} ({n})" for label, n in better) + " (none of these values is sourced).")
    return "\n".join([
        "# The paper reproduction's sensitivity to its assumed constants", "",
        "Command: `python -m benchmarks.paper_sensitivity` (benchmarks/paper_sensitivity.py says what a row does). "
        "Each row halves or doubles one assumed constant of the Ascend 910C preset (shares of peak capped at 1), "
        "refits eff_attn, eff_link and host_step on their cells, and scores the cells benchmarks/paper_repro.py "
        "scores as predicted (its statuses; the request streams as its `--quick` runs them). 512K totals: "
        "CPP / DCPP / VPP-Async against Tables 1 and 2.", "",
        md_table(["variant", "change", "refitted eff_attn / eff_link / host_step", "predicted within",
                  "512K totals vs paper", "VPP-Async < CPP < DCPP", "cells in (vs adopted)", "cells out"], body), "",
        verdict, ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--quick", action="store_true", help="the adopted model and one variant only")
    ap.add_argument("--statuses", metavar="JSON", help="take the predicted cells from this paper_repro.json "
                    "instead of recomputing the statuses (three more sweeps)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    predicted = adopted_predicted() if args.statuses is None else statuses_from(args.statuses)
    rows = [(label, changes, evaluate(changes, predicted)) for label, changes in variants(args.quick)]
    md = report(rows) + f"\n_Generated in {time.time() - t0:.0f} s._\n"
    with open(os.path.join(args.out, "paper_sensitivity.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "paper_sensitivity.json"), "w") as f:
        json.dump({"rows": [{"variant": label, "changes": ch, **r} for label, ch, r in rows]}, f, indent=1)
    print(md)
    return 0


__all__ = ["ASSUMED", "adopted_predicted", "evaluate", "main", "report", "statuses_from", "variants"]


if __name__ == "__main__":
    sys.exit(main())
