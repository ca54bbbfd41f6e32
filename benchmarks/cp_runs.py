"""Context parallelism measured: TTFT of one prompt on one rank (PP1), on two CP ranks (CP2) and on a
two-rank pipeline (PP2, VPP-Async), side by side on this machine's CPU ranks (gloo, one thread each).

Each configuration runs as its own ``vpp prefill --json`` (one short untimed warm-up inside, then one
timed prefill); rounds interleave the configurations (PP1, CP2, PP2, then again), so a slower moment of
a shared machine falls on all of them alike. Reported per (model, length): median and [min-max] TTFT
over the rounds and CP2 / PP1, PP2 / PP1 per round (median [min-max]).

Predicted beside measured: before the rounds, ``vpp calibrate --link --model M --tokens T --chunk C
--runs 1`` fits this machine's ``cpu`` preset for each model M (GEMM and copy rates and the gloo link
timed; the attention efficiency and a per-kernel constant fitted on M's chunk times in one one-rank
prefill of T = the shortest length tokens in the runs' C-token chunks: the PP1 run's shape, never a CP
or PP2 one); the cost model then predicts each configuration's TTFT: PP1 as
:class:`~vpp.perf.deployment.DeploymentCost` on one rank, CP2 as
:class:`~vpp.perf.cp.ContextParallelCost` (cp=2, Meta's rule per chunk as the runtime's ``auto``,
experts on every CP rank as the runtime keeps them), PP2 VPP-Async as the simulated plan on the run's
layout, each through :func:`vpp.schedules.runner.simulate`.

Run ``python -m benchmarks.cp_runs`` (16K and 32K tokens on tiny-deepseek and tiny-qwen, 3 rounds;
writes ``--out`` + .md, .json and _calibration_MODEL.json, by default cp_runs in the results folder);
``--lengths 4096 --rounds 2 --models tiny-qwen`` for a quick look; ``--calibration FILE`` reuses
calibrations (``{model}`` in FILE stands for the model's name); ``--from-json FILE`` re-renders a
results file (predictions recomputed) without measuring.
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


def predict(model: str, length: int, chunk: int, config: str, device) -> float:
    """The cost model's TTFT of one configuration on ``device`` (see the module docstring)."""
    from vpp.models.registry import open_model
    from vpp.models.run_layout import layout_for
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.perf.arch import Arch
    from vpp.perf.cp import ContextParallelCost
    from vpp.perf.deployment import DeploymentCost
    from vpp.perf.ops import Parallel
    from vpp.schedules.runner import simulate
    arch = Arch.from_config(TINY_CONFIGS[model], name=model)
    par = Parallel(tp=1, act_bytes=4, weight_bytes=4, kv_bytes=4)
    strategy = "vpp-async" if config == "pp2-vpp-async" else "cpp"
    layout = layout_for(open_model(model), strategy, 2 if config == "pp2-vpp-async" else 1)
    if config == "cp2":
        cost = ContextParallelCost(arch, device, layout, par, cp=2, ring="rule", experts="rank")
    else:
        cost = DeploymentCost(arch, device, layout, par)
    return simulate(strategy, layout, length, cost, chunk_size=chunk).summary.makespan


def add_predictions(cells, calibration: str) -> None:
    """Each cell's predicted TTFT per configuration, on its model's calibration (``{model}`` in the path)."""
    from vpp.perf.hardware import get_device
    for cell in cells:
        device = get_device("cpu", calibration.format(model=cell["model"]))
        cell["predicted_s"] = {c: predict(cell["model"], cell["length"], cell["chunk"], c, device) for c in CONFIGS}
        cell["predicted_over_measured"] = {c: cell["predicted_s"][c] / cell["ttft_s"][c]["median"] for c in CONFIGS}


def calibrate(path: str, model: str, tokens: int, chunk: int) -> None:
    argv = [sys.executable, "-m", "vpp", "calibrate", "--link", "--model", model, "--tokens", str(tokens),
            "--chunk", str(chunk), "--runs", "1", "--out", path]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"vpp calibrate: exit {done.returncode}: {done.stderr.strip()[-400:]}")
    print(done.stdout, file=sys.stderr, flush=True)


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
    if all("predicted_s" in c for c in cells):
        lines += ["", "Predicted by the cost model with the `cpu` preset that `vpp calibrate` fitted for each model "
                  "in the same session (on one one-rank prefill of the shortest length: the PP1 shape; CP2 and "
                  "PP2 never fitted; see the script's docstring): TTFT in seconds and predicted / measured median.", "",
                  "| model | tokens | PP1 | CP2 | PP2 VPP-Async |", "|---|---|---|---|---|"]
        for c in cells:
            p, r = c["predicted_s"], c["predicted_over_measured"]
            lines.append(f"| {c['model']} | {c['length']} | " + " | ".join(
                f"{p[k]:.2f} ({r[k]:.2f}x)" for k in CONFIGS) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny-deepseek,tiny-qwen")
    p.add_argument("--lengths", default="16384,32768")
    p.add_argument("--chunk-size", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/cp_runs")
    p.add_argument("--calibration", help="`vpp calibrate` JSON(s) to predict with, {model} standing for the model "
                                         "(default: calibrate each model first, writing OUT_calibration_{model}.json)")
    p.add_argument("--from-json", help="re-render this results file (predictions recomputed), measuring nothing")
    args = p.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            data = json.load(f)
        cells, load, rounds = data["cells"], data["load"], data["rounds"]
        calibration = args.calibration or data["calibration"]
    else:
        calibration = args.calibration or args.out + "_calibration_{model}.json"
        if not args.calibration:
            lengths = [int(x) for x in args.lengths.split(",")]
            for model in args.models.split(","):
                calibrate(calibration.format(model=model), model, min(lengths), min(args.chunk_size, min(lengths)))
        load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start"
        rounds = args.rounds
        cells = run(args.models.split(","), [int(x) for x in args.lengths.split(",")], args.rounds, args.chunk_size)
    add_predictions(cells, calibration)
    with open(args.out + ".json", "w") as f:
        json.dump({"cells": cells, "rounds": rounds, "load": load, "calibration": calibration}, f, indent=2)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(cells, rounds, load))
    print(markdown(cells, rounds, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
