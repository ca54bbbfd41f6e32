"""Simulated request streams: CPP / DCPP / VPP / VPP-Async / VPP-Async + packing side by side.

Every strategy runs the same model (8 layers on 2 ranks unless told otherwise) under one cost model with
linear tau_k and a transfer time: the development machine's measured per-layer law (tau_k ~ 89 +
34 k ms per layer for 1K-token chunks; :func:`vpp.schedules.stream_comparison.machine_cost`). Workloads are
the paper's (Sec. 6.1) scaled by one factor (``--scale``, default 32, so the paper's 32K chunk is 1K):

1. the Sec. 6.4 ablation stream: 256K-token requests, three in flight (the main table), also on deeper
   pipelines (P = 3, 4) and a W (folds = 2);
2. long: 64K .. 1M one at a time (concurrency 1: nothing to pack, by construction);
3. short: 100 concurrent requests of 4K, 8K, 16K;
4. mixed: 500 heavy-tailed requests, concurrency 16.

Rows in parentheses are context: non-blocking CPP / DCPP (rank 0 may run ahead without bound) and
VPP-Async's cost-unaware pipelined order.

"Drain idle" is the bubble (idle that is not waiting for work), summed over ranks, inside the drain
windows: for every request with a successor, from the end of stage 0 on its last chunk to its first
token (:func:`vpp.schedules.stream.drain_idle`). "Removed" fractions are relative to VPP-Async.
Writes the tables and the command line to ``benchmarks/results/stream_sim.md``.

    python -m benchmarks.stream_sim [--scale 32] [--requests 4] [--out benchmarks/results/stream_sim.md]
"""

from __future__ import annotations

import argparse
import os
import sys


from vpp.schedules import strategies, workloads as W
from vpp.schedules.strategies import PLANNED as STRATEGIES
from vpp.schedules.stream_comparison import (EXTRA, StreamSetup, compare, format_effect, format_table,
                                             packing_effect)


def section(title: str, setup: StreamSetup, workload, notes: str = "") -> tuple[str, dict]:
    rows = compare(setup, workload, STRATEGIES + EXTRA)
    text = [f"## {title}", "", f"{workload.describe()}; pp={setup.pp}, folds={setup.folds}, {setup.layers} layers, "
            f"chunks of {setup.chunk_size} tokens (DCPP: budget, {setup.dcpp_variant} planner)", ""]
    if notes:
        text += [notes, ""]
    text += [format_table(rows), "", format_effect(rows), ""]
    return "\n".join(text), rows


def deeper(scale: float, requests: int, chunk: int) -> str:
    lines = ["## The ablation stream on deeper pipelines", "",
             "| pipeline | VPP-Async makespan (s) | + packing (s) | shorter | chunks packed | drain idle removed "
             "| all bubble removed | bubble ratio VPP-Async -> packed | best of CPP/DCPP (s) "
             "| (pipelined order) (s) |", "|" + "---|" * 10]
    wl = W.long(scale, lengths=(262144,), repeat=requests, concurrency=3)
    for pp, folds in ((3, 1), (4, 1), (2, 2), (4, 2)):
        setup = StreamSetup(pp=pp, folds=folds, layers=4 * pp * folds, chunk_size=chunk)  # 2 layers per V stage
        rows = compare(setup, wl, STRATEGIES + ("vpp-async-pipelined",))
        e = packing_effect(rows)
        a, p = rows["vpp-async"], rows["vpp-packed"]
        base = min(rows["cpp"].stats.makespan, rows["dcpp"].stats.makespan)
        lines.append(f"| P={pp}, folds={folds}, {setup.layers} layers | {a.stats.makespan:.2f} | {p.stats.makespan:.2f} | "
                     f"{100 * e['makespan_saved']:.1f}% | {e['packed_chunks']} | {100 * e['drain_idle_removed']:.1f}% | "
                     f"{100 * e['bubble_removed']:.1f}% | {100 * a.summary.bubble_ratio:.1f}% -> "
                     f"{100 * p.summary.bubble_ratio:.1f}% | {base:.2f} | "
                     f"{rows['vpp-async-pipelined'].stats.makespan:.2f} |")
    return "\n".join(lines + [""])


def _without_out(argv: list[str]) -> list[str]:
    """The command's arguments as recorded in the report: where it was written is not part of it."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            out.append(a)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=32, help="divide the paper's token counts by this")
    ap.add_argument("--requests", type=int, default=4, help="256K requests in the ablation stream")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "stream_sim.md"))
    args = ap.parse_args(argv)
    chunk = int(round(32768 / args.scale))
    setup = StreamSetup(chunk_size=chunk)
    parts = [f"# Simulated request streams: {', '.join(strategies.get(s).label for s in STRATEGIES)}", "",
             "`" + " ".join(["python -m benchmarks.stream_sim"] + _without_out(sys.argv[1:])) + "`", "",
             "Cost model: this machine's per-layer law (BENCH.md): a 1K-token chunk takes 89 ms per layer after "
             "no prefix and 34 ms more per 1K of prefix (attention 34 ms per 1K x 1K token pairs, half of it "
             "within the chunk), 2 ms per chunk per layer of launch overhead (assumed), fp32 activations of "
             "width 512 over gloo at 3 GB/s + 0.1 ms, half of an async transfer hidden. CPP/DCPP: loop layout, "
             "requests back to back, blocking transfers; VPP: V, one request at a time, blocking; VPP-Async: "
             "V, one at a time, non-blocking; VPP-Async + packing: Algorithm 2 with this cost model as its "
             "estimate. TTFT is from a request's admission (its arrival, or the completion of the request "
             "`concurrency` places earlier) to its first token; throughput is prompt tokens / makespan.", "",
             "Rows in parentheses are context, not the paper's contenders: CPP and DCPP with non-blocking "
             "transfers, where rank 0 may run any number of chunks ahead (unbounded buffering; blocking CPP "
             "keeps about P chunks in flight, like vLLM's and SGLang's batch queues), and VPP-Async with the "
             "cost-unaware pipelined order (chunks of all requests numbered consecutively in the slot key).", ""]
    ablation = W.long(args.scale, lengths=(262144,), repeat=args.requests, concurrency=3)
    text, rows = section("Long stream with packing: the Sec. 6.4 ablation setting (256K requests, 3 in flight)",
                         setup, ablation,
                         "Paper (DeepSeek-V3.1, 256K, 32K chunks, 3 concurrent): VPP -> VPP-Async -3.13%, "
                         "-> + packing -6.89% in all; bubble ratio 11.0% -> 8.3% -> 2.4%.")
    e = packing_effect(rows)
    parts += [text, f"**Packing removes {100 * e['drain_idle_removed']:.1f}% of VPP-Async's drain-window idle** "
              f"({e['drain_idle_async']:.2f} s -> {e['drain_idle_packed']:.2f} s summed over ranks) and "
              f"{100 * e['bubble_removed']:.1f}% of all its bubble; makespan {100 * e['makespan_saved']:.1f}% "
              f"shorter than VPP-Async, "
              f"{100 * (1 - rows['vpp-packed'].stats.makespan / rows['vpp'].stats.makespan):.1f}% shorter "
              f"than VPP.", ""]
    parts.append(deeper(args.scale, args.requests, chunk))
    parts.append(section("Long, growing lengths, one at a time (concurrency 1)", setup, W.long(args.scale),
                         "With one request in flight there is no next request to pack: VPP-Async + packing "
                         "is VPP-Async.")[0])
    for length in W.SHORT_LENGTHS:
        parts.append(section(f"Short: 100 concurrent requests of {length // 1024}K", setup,
                             W.short(args.scale, args.seed, length=length))[0])
    parts.append(section("Mixed: 500 heavy-tailed requests, concurrency 16", setup,
                         W.mixed(args.scale, args.seed))[0])
    text = "\n".join(parts)
    print(text)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
