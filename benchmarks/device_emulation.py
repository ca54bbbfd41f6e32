"""The executor's device path (NCCL/HCCL: the device orders, the host enqueues) on an emulated device.

    python benchmarks/device_emulation.py [--json] [--chunks 16] [--quick] [--out DIR]

Runs the real executor on :mod:`vpp.testing.emulated_run` (NCCL's ordering rules in virtual time,
one thread per rank) for CPP, VPP and VPP-Async at PP 2 and 4: one request of ``--chunks`` 1K chunks,
compute from the paper's Eq. 2 cost model (``LinearCost.eq2``: chunk k costs (k + 1) t per stage,
t = 10 ms per rank-share of the model) and a transfer of one chunk's activation that takes as long as
the first chunk's compute on one stage (``--transfer-ratio`` 1.0). Pair communicators are warmed
first, as a Pipeline does. Each plan runs under each stream model of the device (``--streams``):
one stream per pair communicator (NCCL's lazy default), per process group (NCCL initialised eagerly
with ``device_id=``, and HCCL) and per rank; where a group has one stream vpp batches each step's
transfers, and ``makespan_unfused_s`` is the same run without the batches. For each plan: host
blocking waits on a transfer per chunk (the host
blocked on a transfer: must be 0), host waits on a compute per chunk (the run-ahead bound), the
steady-state receive overlap (fraction of receives' transfer time during which the receiving rank
computed; all receives in ``recv_overlap_all``), the emulated makespan and the simulator's makespan
of the same plan and costs. Virtual time: the figures do not depend on this machine's load.
"""

from __future__ import annotations

import argparse
import json
import os

from vpp.schedules import strategies
from vpp.schedules.cost import LinearCost
from vpp.schedules.layout import make_layout
from vpp.schedules.runner import simulate
from vpp.testing.emulated_run import emulate

SCHEDULES = ("cpp", "vpp", "vpp-async")
CHUNK = 1024


STREAMS = ("pair", "group", "rank")


def row(schedule: str, pp: int, chunks: int, t: float, transfer_ratio: float, streams: str = "pair") -> dict:
    strategy = strategies.get(schedule)
    layout = make_layout(strategy.layout, 8 * pp, pp)
    per_stage = t * pp / layout.num_stages  # every rank holds the same share of the model
    cost = LinearCost.eq2(per_stage, CHUNK, seconds_per_token=transfer_ratio * per_stage / CHUNK)
    simulated = simulate(schedule, layout, chunks * CHUNK, cost, chunk_size=CHUNK, check=True)
    plan = simulated.plan  # the plan the emulated device runs is the one simulated
    res = emulate(plan, cost, streams=streams)
    unfused = res if streams == "pair" else emulate(plan, cost, streams=streams, fuse=False)
    sim = max(s.end for s in simulated.trace.spans)
    return {"schedule": schedule, "pp": pp, "streams": streams, "comm": plan.comm,
            "host_blocking_waits_per_chunk": res.per_chunk("host_transfer_waits"),
            "host_compute_waits_per_chunk": round(res.per_chunk("host_compute_waits"), 3),
            "end_waits_per_chunk": round(res.per_chunk("end_waits"), 3),
            "recv_overlap": round(res.recv_overlap, 4), "recv_overlap_all": round(res.recv_overlap_all, 4),
            "makespan_s": round(res.makespan_s, 6), "makespan_unfused_s": round(unfused.makespan_s, 6),
            "recv_overlap_unfused": round(unfused.recv_overlap, 4), "sim_makespan_s": round(sim, 6),
            "makespan_vs_sim": round(res.makespan_s / sim - 1.0, 6)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print {\"rows\": [...]} instead of a table")
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--transfer-ratio", type=float, default=1.0,
                    help="a chunk's transfer time over the first chunk's compute on one stage")
    ap.add_argument("--quick", action="store_true", help="4 chunks, PP 2 only (the test suite's run)")
    ap.add_argument("--streams", default=",".join(STREAMS), help=f"stream models, comma-separated ({', '.join(STREAMS)})")
    ap.add_argument("--out", help="also write device_emulation.json and .md into this folder")
    args = ap.parse_args(argv)
    if args.chunks < 2 or args.transfer_ratio < 0:
        ap.error(f"--chunks={args.chunks} must be >= 2 and --transfer-ratio={args.transfer_ratio} >= 0")
    chunks, pps = (4, (2,)) if args.quick else (args.chunks, (2, 4))
    models = [m.strip() for m in args.streams.split(",") if m.strip()]
    if not models or set(models) - set(STREAMS):
        ap.error(f"--streams={args.streams!r}: choose from {', '.join(STREAMS)}")
    rows = [row(s, pp, chunks, 0.01, args.transfer_ratio, m) for m in models for pp in pps for s in SCHEDULES]
    doc = {"rows": rows, "chunks": chunks, "chunk_tokens": CHUNK, "transfer_ratio": args.transfer_ratio,
           "command": "python benchmarks/device_emulation.py --json"}
    if args.json:
        print(json.dumps(doc, indent=1))
    header = ["streams", "schedule", "PP", "comm", "host waits on transfers / chunk", "host waits on computes / chunk",
              "recv overlap (steady)", "recv overlap (all)", "makespan s", "unbatched s", "simulator s", "vs sim"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append(f"| {r['streams']} | {r['schedule']} | {r['pp']} | {r['comm']} | {r['host_blocking_waits_per_chunk']:g} | "
                     f"{r['host_compute_waits_per_chunk']:g} | {r['recv_overlap']:.3f} | {r['recv_overlap_all']:.3f} | "
                     f"{r['makespan_s']:.4f} | {r['makespan_unfused_s']:.4f} | {r['sim_makespan_s']:.4f} | "
                     f"{100 * r['makespan_vs_sim']:+.2f}% |")
    table = "\n".join(lines)
    if not args.json:
        print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "device_emulation.json"), "w") as f:
            json.dump(doc, f, indent=1)
        with open(os.path.join(args.out, "device_emulation.md"), "w") as f:
            f.write(f"# The executor's device path on an emulated device\n\n`{doc['command']}` "
                    f"({chunks} chunks of {CHUNK} tokens, transfer = {args.transfer_ratio:g} x the first "
                    f"chunk's compute on one stage; virtual time)\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
