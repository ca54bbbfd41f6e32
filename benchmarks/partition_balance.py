"""Partitions balanced per rank against the even split, measured on this machine.

    python -m benchmarks.partition_balance [--model tiny-deepseek] [--seq-len 16384] [--chunk 1024] [--rounds 5]

Two spawned CPU ranks (one thread each). Every round runs, interleaved, CPP and VPP-Async with the even
split ("before": :func:`vpp.models.snap_partition`) and with the partition balanced per rank on the cost
model ("after": :mod:`vpp.models.run_layout`), each after a barrier; the first round is preceded by a
warm-up. Reports, per configuration, the median TTFT and its spread (min-max) over rounds, and the
VPP-Async / CPP TTFT ratio computed per round. Writes ``benchmarks/results/partition_balance.md`` and
``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))


def _worker(rank: int, world: int, args) -> dict | None:
    from vpp.cli.prefill_rounds import BenchConfig, run_bench
    from vpp.parallel import initialize_model_parallel
    groups = initialize_model_parallel(1, 2)
    out: dict = {"ttft": {}, "layouts": {}}
    for r in range(args.rounds):
        for part in ("even", "rank"):
            cfg = BenchConfig(model=args.model, pp=2, seq_len=args.seq_len, chunk_size=args.chunk,
                              schedules=("cpp", "vpp-async"), partition=part, repeat=1, warmup=r == 0)
            rows, facts = run_bench(groups, cfg)
            for row in rows:
                out["ttft"].setdefault(f"{part}/{row.schedule}", []).append(row.ttft[0])
            out["layouts"][part] = facts["layouts"]
    return out if groups.global_rank == 0 else None


def _rank_note(args) -> str:
    """Which layers each rank holds under the two partitions (and the cost model's heaviest rank)."""
    from vpp.models.run_layout import choose_partition, layer_costs
    from vpp.models.registry import open_model
    from vpp.schedules import make_layout, rank_loads
    model = open_model(args.model)
    costs, embed, head = layer_costs(model.config, chunk=args.chunk, seq_len=args.seq_len)
    out = []
    for kind, schedule in (("loop", "cpp"), ("v", "vpp-async")):
        held = {}
        for how in ("even", "rank"):
            part = choose_partition(model, kind, 2, chunk=args.chunk, seq_len=args.seq_len, how=how,
                                    schedule=schedule)
            lay = make_layout(kind, model.num_layers, 2, partition=part)
            held[how] = [sorted(i for st in lay.stages_of(r) for i in lay.layers_of(st)) for r in range(2)]
            top = max(rank_loads(part, costs, lay.stage_ranks, embed_cost=embed, head_cost=head))
            held[how].append(top)
        same = held["even"][:2] == held["rank"][:2]
        out.append(f"{kind}: ranks hold layers {held['even'][:2]} (even) and {held['rank'][:2]} (per rank), "
                   f"heaviest rank {held['even'][2]:.3f} vs {held['rank'][2]:.3f} s per chunk in the cost model"
                   + (" -- the same layers on each rank" if same else ""))
    return "Rank contents (cost model, the cpu preset): " + "; ".join(out) + "."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-deepseek", help="built-in model name or model directory")
    ap.add_argument("--seq-len", type=int, default=8192, help="prompt tokens (vpp prefill's default)")
    ap.add_argument("--chunk", type=int, default=2048, help="tokens per chunk (vpp prefill's default)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for partition_balance.md/.json")
    args = ap.parse_args(argv)
    from vpp.parallel import launch
    load0, t0 = os.getloadavg()[0], time.time()
    res = launch(_worker, 2, args, timeout=7200, threads=1)[0]
    elapsed, load1 = time.time() - t0, os.getloadavg()[0]
    stat = lambda xs: (statistics.median(xs), min(xs), max(xs))
    ratios = {p: [v / c for v, c in zip(res["ttft"][f"{p}/vpp-async"], res["ttft"][f"{p}/cpp"])] for p in ("even", "rank")}
    cmd = "python -m benchmarks.partition_balance " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out")
    lines = ["# Partitions balanced per rank vs even, measured", "",
             f"`{cmd}` ({elapsed:.0f} s, {time.strftime('%Y-%m-%d %H:%M')}, load {load0:.2f} -> {load1:.2f}); "
             f"{args.rounds} interleaved rounds, median [min-max].", "",
             "| partition | layouts | CPP TTFT s | VPP-Async TTFT s | VPP-Async / CPP (per round) |", "|---|---|---|---|---|"]
    for p in ("even", "rank"):
        c, v, q = stat(res["ttft"][f"{p}/cpp"]), stat(res["ttft"][f"{p}/vpp-async"]), stat(ratios[p])
        lay = "; ".join(f"{s}: {d}" for s, d in res["layouts"][p].items())
        lines.append(f"| {p} | {lay} | {c[0]:.3f} [{c[1]:.3f}-{c[2]:.3f}] | {v[0]:.3f} [{v[1]:.3f}-{v[2]:.3f}] | "
                     f"{q[0]:.3f} [{q[1]:.3f}-{q[2]:.3f}] |")
    after = [a / b for a, b in zip(res["ttft"]["rank/vpp-async"], res["ttft"]["even/vpp-async"])]
    lines += ["", f"VPP-Async after / before, per round: {statistics.median(after):.3f} "
                  f"[{min(after):.3f}-{max(after):.3f}].", "", _rank_note(args), ""]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "partition_balance.md"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(args.out, "partition_balance.json"), "w") as f:
        json.dump({"command": cmd, "elapsed_s": elapsed, "load": [load0, load1], **res}, f, indent=1)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
