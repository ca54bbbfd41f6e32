"""``vpp tune``: choose layout, folds, partition, chunk budget, chunking and context parallelism by
simulation.

    vpp tune --model deepseek-v3.1 --device 910c --length 524288 [--tp 8] [--pp 2] [--calibration benchmarks/results/paper_repro.json] [--no-cp]

Prints the best configurations by predicted TTFT, with the memory per device and whether it fits, and the
gain over the paper's best configuration (VPP-Async, V with one fold, best of 8K..32K). The tp x pp
devices may also be regrouped for context parallelism (CP alone, or VPP-Async x CP; ``--no-cp`` turns
that off). The presets hold datasheet constants; ``--calibration FILE`` replaces them with fitted ones: ``vpp
calibrate``'s JSON for ``--device cpu``, or the paper study's fit on the 910C (``python -m benchmarks.paper.paper_repro``
writes it to ``benchmarks/results/paper_repro.json``).
"""

from __future__ import annotations

import json

from vpp.cli.args import UsageError, check_chunk_count, int_list, positive_int, writable_file
from vpp.safe_write import write_text
from vpp.perf.hardware import get_device
from vpp.perf.runs import paper_setup
from vpp.perf.deployment_search import PAPER_CHUNKS, paper_best, tune

TUNE_MAX_COMPUTES = 32_768  # stage computes of one simulated configuration (4096 chunks on pp=2, 2 folds): ~3 min in all


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="deepseek-v3.1", help="deepseek-v3.1, glm-5.2, qwen3-coder-30b-a3b or a config.json")
    parser.add_argument("--device", default="910c", help="910c, h100, h200 or cpu")
    parser.add_argument("--calibration", default=None,
                        help="fitted constants: vpp calibrate's JSON (--device cpu), or the paper study's fit "
                             "(benchmarks/results/paper_repro.json, --device 910c)")
    parser.add_argument("--length", type=positive_int, default=524288, help="prompt tokens")
    parser.add_argument("--tp", type=positive_int, default=8, help="tensor-parallel degree of the deployment")
    parser.add_argument("--pp", type=positive_int, default=2, help="pipeline ranks of the deployment")
    parser.add_argument("--chunks", type=int_list, default=PAPER_CHUNKS, help="comma-separated budgets")
    parser.add_argument("--max-folds", type=positive_int, default=2, help="largest number of V folds tried")
    parser.add_argument("--top", type=positive_int, default=10, help="rows to print")
    parser.add_argument("--no-cp", action="store_true", help="do not regroup the devices for context parallelism")
    parser.add_argument("--json", default=None, help="also write the ranking here")


def check(args) -> None:
    from vpp.perf.configs import get_config
    try:
        args.device_obj = get_device(args.device, args.calibration)
        get_config(args.model)
    except (KeyError, ValueError, OSError) as exc:
        raise UsageError(str(exc).strip("'\"")) from None
    if args.json:
        writable_file(args.json, "--json")
    check_chunk_count([args.length], min(args.chunks), "--chunks", stages=2 * args.pp * args.max_folds,
                      limit=TUNE_MAX_COMPUTES, whose="tune's limit per simulation (it simulates ~100 configurations)")


def schedule_of(cand) -> str:
    """The ``vpp prefill`` schedule of a tuner row: the loop runs CPP (DCPP with DCPP's chunks); the V and
    the interleaved layout run VPP, or VPP-Async with asynchronous transfers."""
    if cand.kind == "loop":
        return "dcpp" if cand.chunking == "dcpp" else "cpp"
    return "vpp-async" if cand.comm == "async" else "vpp"


def deployment(cand, setup) -> dict:
    """The runtime's (cp, tp, pp, schedule, folds, layout, partition, chunk, taper) of a tuner row:
    ``layout`` "interleaved" for Megatron's layout (None: the schedule's own), ``taper`` the (head, tail)
    ramps of a tapered chunking (empty for fixed chunks)."""
    pp = cand.pp or setup.pp
    return dict(cp=cand.cp, tp=setup.devices // (pp * cand.cp), pp=pp, schedule=schedule_of(cand),
                folds=cand.folds if cand.kind != "loop" else 1,
                layout="interleaved" if cand.kind == "interleaved" else None,
                partition="even" if cand.partition == "even" else "rank", chunk=cand.chunk,
                taper=(cand.head, cand.tail))


def _fractions(values) -> str:
    return ",".join(f"{v:g}" for v in values)


def command(cand, setup, length: int, model: str = "CHECKPOINT") -> str:
    """The command that runs a tuner row's deployment (one line)."""
    d = deployment(cand, setup)
    ranks = d["cp"] * d["tp"] * d["pp"]
    out = f"torchrun --nproc-per-node {ranks} -m vpp prefill --model {model}"
    if d["cp"] > 1:
        out += f" --cp {d['cp']}"
    out += f" --tp {d['tp']} --pp {d['pp']}"
    if d["pp"] > 1:  # one stage (CP alone): no schedule, folds or partition to choose
        out += f" --schedule {d['schedule']}" + (f" --folds {d['folds']}" if d["folds"] > 1 else "")
        out += f" --layout {d['layout']}" if d["layout"] else ""
        out += f" --partition {d['partition']}"
    head, tail = d["taper"]
    out += f" --taper-head {_fractions(head)}" if head else ""
    out += f" --taper-tail {_fractions(tail)}" if tail else ""
    return out + f" --seq-len {length} --chunk-size {d['chunk']}"


def run(args) -> int:
    device = args.device_obj
    setup = paper_setup(args.model, device, tp=args.tp, pp=args.pp)
    chunks = tuple(args.chunks)
    ranked = tune(setup, args.length, chunks=chunks, max_folds=args.max_folds, cp=not args.no_cp)
    base = paper_best(setup, args.length, chunks)
    print(f"{args.model} on {device.name}, tp={args.tp} pp={args.pp}, {args.length} tokens: "
          f"{len(ranked)} configurations simulated")
    print(f"{'rank':>4} {'TTFT s':>10} {'vs paper':>9} {'bubble':>7} {'chunks':>6} {'GB/dev':>7}  configuration")
    for i, r in enumerate(ranked[: args.top]):
        gain = 100.0 * (base.ttft - r.ttft) / base.ttft
        mem = f"{r.memory / 1e9:.1f}" + ("" if r.fits else "!")
        print(f"{i + 1:>4} {r.ttft:>10.3f} {gain:>+8.2f}% {100 * r.bubble_ratio:>6.1f}% {r.chunks:>6} {mem:>7}  "
              f"{r.candidate.describe()}")
        print(f"{'':>4} run: {command(r.candidate, setup, args.length)}")
    if any(not r.fits for r in ranked[: args.top]):
        print(f"!: exceeds the device's {device.mem_bytes / 1e9:.0f} GB")
    print(f"paper's best configuration: {base.ttft:.3f} s ({base.candidate.describe()}); "
          f"vs paper = how much lower this row's TTFT is than that one's, in %")
    print(f"run: the command of each row's deployment (CHECKPOINT: a model directory of {args.model}; under torchrun "
          f"with more ranks than one node's, add --nnodes and the rendezvous options)")
    if args.json:
        write_text(args.json, json.dumps({"paper_best": {"ttft": base.ttft, "config": base.candidate.describe()},
                       "ranked": [{"ttft": r.ttft, "bubble_ratio": r.bubble_ratio, "chunks": r.chunks,
                                   "memory_gb": r.memory / 1e9, "fits": r.fits, "cp": r.candidate.cp,
                                   "config": r.candidate.describe(),
                                   "command": command(r.candidate, setup, args.length)} for r in ranked]}, indent=1))
    return 0


__all__ = ["TUNE_MAX_COMPUTES", "add_arguments", "check", "command", "deployment", "run", "schedule_of"]
