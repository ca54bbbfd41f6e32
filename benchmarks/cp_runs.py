"""Context parallelism measured: TTFT of one prompt on one rank (PP1), on two CP ranks (CP2) and on a
two-rank pipeline (PP2, VPP-Async), side by side on this machine's CPU ranks (gloo, one thread each).

Each configuration runs as its own ``vpp prefill --json`` (one untimed warm-up inside, then one timed
prefill); rounds interleave the configurations (PP1, CP2, PP2, then again), so a slower moment of a
shared machine falls on all of them alike. Reported per (model, length): median and [min-max] TTFT
over the rounds and CP2 / PP1, PP2 / PP1 per round (median [min-max]). Run
``python -m benchmarks.cp_runs`` (16K and 32K tokens on tiny-deepseek and tiny-qwen, 3 rounds; writes
``--out`` + .md and .json, by default cp_runs in the results folder); ``--lengths 4096 --rounds 2
--models tiny-qwen`` for a quick look. No results are committed yet: the 16K/32K runs did not fit the
session that wrote this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = {
    "pp1": ["--pp", "1", "--schedule", "cpp"],
    "cp2": ["--cp", "2", "--cp-attention", "auto"],
    "pp2-vpp-async": ["--pp", "2", "--schedule", "vpp-async"],
}


def measure(model: str, length: int, chunk: int, config: str) -> dict:
    """One ``vpp prefill --json`` run: its TTFT and the process's CPU seconds (children included)."""
    argv = [sys.executable, "-m", "vpp", "prefill", "--model", model, "--seq-len", str(length), "--chunk-size",
            str(chunk), "--repeat", "1", "--json", "--no-progress", "--device", "cpu", *CONFIGS[config]]
    before = os.times()
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = os.times()
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv[2:])}: exit {done.returncode}: {done.stderr.strip()[-400:]}")
    out = json.loads(done.stdout)
    ttft = out["ttft_s"][0] if "ttft_s" in out else out["rows"][0]["ttft"]["values"][0]
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"ttft_s": ttft, "wall_s": wall, "cpu_s": cpu, "methods": out.get("methods")}


def _stats(values) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": list(values)}


def run(models, lengths, rounds: int, chunk: int) -> list[dict]:
    cells = []
    for model in models:
        for length in lengths:
            runs = {c: [] for c in CONFIGS}
            for r in range(rounds):
                for config in CONFIGS:
                    runs[config].append(measure(model, length, chunk, config))
                    print(f"{model} {length} round {r + 1}/{rounds} {config}: TTFT {runs[config][-1]['ttft_s']:.2f} s",
                          file=sys.stderr, flush=True)
            cell = {"model": model, "length": length, "chunk": chunk,
                    "ttft_s": {c: _stats([x["ttft_s"] for x in v]) for c, v in runs.items()},
                    "cpu_s": {c: _stats([x["cpu_s"] for x in v]) for c, v in runs.items()},
                    "cp2_methods": runs["cp2"][-1]["methods"]}
            for config in ("cp2", "pp2-vpp-async"):
                cell[f"{config}_over_pp1"] = _stats([a["ttft_s"] / b["ttft_s"] for a, b in zip(runs[config], runs["pp1"])])
            cells.append(cell)
    return cells


def _fmt(s: dict, digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def markdown(cells, rounds: int, load: str) -> str:
    lines = ["# Context parallelism measured: PP1 vs CP2 vs PP2 (VPP-Async), CPU ranks", "",
             f"`python -m benchmarks.cp_runs` ({rounds} interleaved rounds; gloo, one thread per rank; {load}). "
             "TTFT in seconds, median [min-max]; ratios per round.", "",
             "| model | tokens | chunk | PP1 TTFT | CP2 TTFT | PP2 VPP-Async TTFT | CP2 / PP1 | PP2 / PP1 | CP2 attention |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        t = c["ttft_s"]
        methods = ", ".join(f"{m} x{c['cp2_methods'].count(m)}" for m in dict.fromkeys(c["cp2_methods"] or []))
        lines.append(f"| {c['model']} | {c['length']} | {c['chunk']} | {_fmt(t['pp1'])} | {_fmt(t['cp2'])} | "
                     f"{_fmt(t['pp2-vpp-async'])} | {_fmt(c['cp2_over_pp1'], 3)} | {_fmt(c['pp2-vpp-async_over_pp1'], 3)} "
                     f"| {methods} |")
    lines += ["", "CPU seconds per run (all ranks, median): " + "; ".join(
        f"{c['model']} {c['length']}: " + ", ".join(f"{k} {v['median']:.1f}" for k, v in c["cpu_s"].items())
        for c in cells)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny-deepseek,tiny-qwen")
    p.add_argument("--lengths", default="16384,32768")
    p.add_argument("--chunk-size", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/cp_runs")
    args = p.parse_args(argv)
    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start"
    cells = run(args.models.split(","), [int(x) for x in args.lengths.split(",")], args.rounds, args.chunk_size)
    with open(args.out + ".json", "w") as f:
        json.dump({"cells": cells, "rounds": args.rounds, "load": load}, f, indent=2)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(cells, args.rounds, load))
    print(markdown(cells, args.rounds, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
