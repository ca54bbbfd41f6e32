"""Measured on this machine: the figures the issues ask for, regenerated in one command.

    python -m benchmarks.measured [--quick] [--jobs prefill,stream-long,...] [--out DIR]

1. ``vpp prefill`` (tiny DeepSeek, 2 ranks x 1 thread, a long prompt where chunk latency grows
   several-fold): CPP vs VPP vs VPP-Async, TTFT, bubble ratio, and the simulator replaying the measured
   per-chunk costs.
2. ``vpp serve-bench`` on the paper's long and mixed workloads scaled to this machine: CPP, DCPP, VPP,
   VPP-Async, VPP-Async + packing and torch.distributed.pipelining's GPipe. The long workload twice:
   growing lengths one at a time (nothing to pack), and the Sec. 6.4 ablation stream (equal long
   requests, 3 in flight), where packing has a drain to fill.

Writes ``benchmarks/results/measured.md`` (tables, commands, load average) and ``measured.json`` (``--out DIR``
elsewhere).
Timings are medians [min-max] of interleaved rounds (one warm-up, the contenders A B C A B C ...).
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# DCPP at these scaled 512-token budgets: vLLM-Ascend's 4096 floor clamps to the budget (no shrinking), so
# the streams keep the 256-token floor (budget // 2) these results were first measured with.
DCPP_FLOOR = ["--dcpp-min-chunk", "256"]
JOBS = {
    "prefill": ["prefill", "--model", "tiny-deepseek", "--pp", "2", "--seq-len", "12288", "--chunk-size", "1024",
                "--repeat", "5", "--check"],
    "stream-long": ["serve-bench", "--workload", "long", "--scale", "64", "--lengths", "65536,131072,262144,524288",
                    "--chunk-size", "512", "--repeat", "3", *DCPP_FLOOR],
    "stream-long-3": ["serve-bench", "--workload", "long", "--scale", "64", "--lengths", "262144,262144,262144,262144",
                      "--concurrency", "3", "--chunk-size", "512", "--repeat", "3", *DCPP_FLOOR],
    "stream-mixed": ["serve-bench", "--workload", "mixed", "--scale", "64", "--n", "24", "--concurrency", "4",
                     "--chunk-size", "512", "--repeat", "3", "--contenders", "cpp,dcpp,vpp,vpp-async,vpp-packed",
                     *DCPP_FLOOR],
}
# appended to a job's arguments (argparse keeps the last value of an option)
QUICK = {"prefill": ["--seq-len", "1024", "--chunk-size", "256", "--repeat", "1"],
         "stream-long": ["--scale", "256", "--lengths", "65536,131072", "--chunk-size", "128", "--repeat", "1"],
         "stream-long-3": ["--scale", "256", "--lengths", "65536,65536,65536", "--chunk-size", "128", "--repeat", "1"],
         "stream-mixed": ["--scale", "256", "--n", "6", "--chunk-size", "128", "--repeat", "1"]}


def run(job: str, quick: bool) -> tuple[str, str]:
    args = JOBS[job] + (QUICK[job] if quick else [])
    cmd = [sys.executable, "-m", "vpp", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"job {job}: `vpp {' '.join(args)}` exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return "vpp " + " ".join(args), proc.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not a measurement)")
    ap.add_argument("--jobs", default=",".join(JOBS), help="jobs to (re)run; the others keep their last results")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="directory for measured.md and measured.json")
    args = ap.parse_args(argv)
    out_dir = args.out
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "measured.json")
    record = {}
    if os.path.exists(json_path) and not args.quick:
        with open(json_path) as f:
            record = json.load(f)
    for job in filter(None, args.jobs.split(",")):   # --jobs "" rewrites measured.md from measured.json
        load_before, start = os.getloadavg()[0], time.time()
        command, table = run(job, args.quick)
        record[job] = {"command": command, "table": table, "seconds": time.time() - start,
                       "when": time.strftime("%Y-%m-%d %H:%M"), "load_before": load_before,
                       "load_after": os.getloadavg()[0]}
        print(table, flush=True)
    parts = ["# Measured on this machine", "",
             f"`python -m benchmarks.measured{' --quick' if args.quick else ''}` on {os.cpu_count()} CPU cores. "
             "Each section gives its command, when it ran and the 1-minute load average before and after.", ""]
    for job in JOBS:
        if job in record:
            r = record[job]
            load = " -> ".join("not recorded" if r.get(k) is None else f"{r[k]:.2f}" for k in ("load_before", "load_after"))
            parts += [f"## {job}", "", f"`{r['command']}` ({r['seconds']:.0f} s, {r.get('when', '?')}, load {load})", "",
                      r["table"].strip(), ""]
    with open(os.path.join(out_dir, "measured.md"), "w") as f:
        f.write("\n".join(parts) + "\n")
    with open(json_path, "w") as f:
        json.dump(record, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
