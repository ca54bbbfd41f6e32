"""Tail merging at the paper's lengths, in simulation: a final chunk smaller than a threshold joins the
one before (SGLang PR #23621's tiny-tail case), for CPP, DCPP (vLLM-Ascend main, online calibration)
and VPP-Async, on the paper's deployment (16 x 910C, TP8 + PP2, with the constants the paper study fitted,
read from ``--calibration``: benchmarks/results/paper_repro.json).

Every (model, strategy, length, budget) cell is simulated plain and with ``merge_tail`` = 512 tokens
and = ``budget // 4``; a table per threshold lists the cells whose chunking changed, with the TTFT of
both, and a line counts the rest. Run ``python -m benchmarks.tail_merge`` (writes
benchmarks/results/tail_merge.md and .json); ``--quick`` runs one model, two lengths and one budget.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from vpp.perf.hardware import get_device
from vpp.perf.runs import paper_setup, run
from vpp.report import kib, md_table
from vpp.schedules import Request, chunk_requests
from vpp.schedules.dcpp import DcppPlanner, plan_online, profiled_stages, stage_measure

STRATEGIES = ("cpp", "dcpp", "vpp-async")
MODELS = ("deepseek-v3.1", "qwen3-coder-30b-a3b")
LENGTHS = (65536, 131072, 262144, 524288, 1048576)      # the paper's long-sequence sweep
BUDGETS = (4096, 8192, 16384, 24576, 32768)              # the paper's four budgets and 4K
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def requests(setup, strategy: str, length: int, budget: int, threshold: int) -> list[Request]:
    """The request of one prompt, cut as ``strategy`` cuts it, tails below ``threshold`` merged."""
    if strategy != "dcpp":
        return chunk_requests([length], budget, merge_tail_below=threshold)
    layout = setup.layout("loop")
    cost = setup.cost(layout, "dcpp")
    stages = profiled_stages(layout, setup.dcpp_variant)
    planner = DcppPlanner(setup.dcpp_variant, budget=budget, merge_tail=threshold).profile(stage_measure(cost, stages))
    sizes = plan_online(planner, [length], lambda c, h: sum(cost.compute(s, c, h) for s in stages))[0]
    return [Request(0, tuple(sizes))]


def cells(device, models, lengths, budgets, fixed_threshold: int | None = None):
    out = []
    for model in models:
        setup = paper_setup(model, device)
        for strategy in STRATEGIES:
            for length in lengths:
                for budget in budgets:
                    threshold = budget // 4 if fixed_threshold is None else fixed_threshold
                    plain = requests(setup, strategy, length, budget, 0)
                    merged = requests(setup, strategy, length, budget, threshold)
                    cell = {"model": model, "strategy": strategy, "length": length, "budget": budget,
                            "threshold": threshold, "chunks": len(plain[0].chunk_sizes),
                            "tail": plain[0].chunk_sizes[-1], "changed": plain != merged}
                    if cell["changed"]:
                        a = run(setup, strategy, [length], budget, requests=plain).row.makespan
                        b = run(setup, strategy, [length], budget, requests=merged).row.makespan
                        cell.update(ttft_plain=a, ttft_merged=b, gain=(a - b) / a,
                                    merged_last=merged[0].chunk_sizes[-1])
                    out.append(cell)
    return out


def section(rows, name: str) -> str:
    changed = [r for r in rows if r["changed"]]
    table = md_table(["model", "strategy", "length", "budget", "chunks", "tail", "merged last chunk",
                      "TTFT plain s", "TTFT merged s", "TTFT change"],
                     [[r["model"], r["strategy"], kib(r["length"]), kib(r["budget"]), r["chunks"], r["tail"],
                       r["merged_last"], r["ttft_plain"], r["ttft_merged"], f"{-100 * r['gain']:+.2f}%"]
                      for r in changed])
    gains = sorted(r["gain"] for r in changed)
    summary = (f"{len(changed)} of {len(rows)} cells have a final chunk below {name} and change"
               + (f"; TTFT change from {-100 * gains[-1]:+.2f}% to {-100 * gains[0]:+.2f}% "
                  f"(median {-100 * gains[len(gains) // 2]:+.2f}%)." if gains else "."))
    return f"## Threshold: {name}\n\n{summary}\n\n{table}\n"


def report(sections, command: str, seconds: float) -> str:
    return (f"# Tail merging at the paper's lengths (simulated)\n\nCommand: `{command}`\n\n"
            f"A final chunk below the threshold joins the one before. Paper deployment: 16 x 910C, TP8 + PP2, "
            f"the cost model with the paper study's fitted constants (paper_repro.json); DCPP = vLLM-Ascend main with online calibration. One "
            f"request alone: its last chunk runs in the drain, so a longer last chunk is on the critical path.\n\n"
            + "\n".join(sections) + f"\n_Generated in {seconds:.0f} s._\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one model, two lengths, one budget (a smoke run)")
    ap.add_argument("--out", default=RESULTS, help="directory for tail_merge.md/json ('' to print only)")
    ap.add_argument("--calibration", default=os.path.join(RESULTS, "paper_repro.json"),
                    help="the 910C's fitted constants (a JSON whose 'fit' holds them; default: the paper study's)")
    args = ap.parse_args(argv)
    t0 = time.time()
    device = get_device("910c", args.calibration)
    grid = (MODELS[:1], (65536, 131072), (24576,)) if args.quick else (MODELS, LENGTHS, BUDGETS)
    rows = {"512": cells(device, *grid, 512), "budget // 4": cells(device, *grid)}
    command = "PYTHONPATH=. python benchmarks/tail_merge.py" + (" --quick" if args.quick else "")
    text = report([section(r, name) for name, r in rows.items()], command, time.time() - t0)
    print(text)
    if args.out and not args.quick:
        with open(os.path.join(args.out, "tail_merge.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "tail_merge.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
