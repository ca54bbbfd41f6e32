"""``python -m vpp serve-sim``: a request stream of the paper's workloads, simulated under CPP, DCPP, VPP,
VPP-Async and VPP-Async + packing, as one table (makespan, TTFT median / p90, throughput, bubble ratio,
exposed communication, drain-window idle) plus what packing removes.

Example::

    python -m vpp serve-sim --workload long --lengths 262144 --repeat 4 --concurrency 3
    python -m vpp serve-sim --workload mixed --scale 32 --pp 4 --folds 2 --layers 32 --json

Lengths are the paper's divided by ``--scale``; ``--chunk-size`` is in scaled tokens (default 1024: the
paper's 32K at scale 32). The cost model is this machine's per-layer law
(:func:`vpp.schedules.stream_comparison.machine_cost`: the development machine's per-layer law).
"""

from __future__ import annotations

import argparse
import json

from vpp.cli.args import (UsageError, check_chunk_count, check_workload_options, nonnegative_int, positive_float,
                          positive_int)
from vpp.schedules.dcpp import DEFAULT_VARIANT, VARIANTS

WORKLOADS = ("long", "short", "mixed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="long", choices=WORKLOADS, help="the paper's workload (Sec. 6.1)")
    parser.add_argument("--scale", type=positive_float, default=32, help="divide the paper's token counts by this")
    parser.add_argument("--seed", type=int, default=0, help="seed of drawn lengths and arrivals")
    parser.add_argument("--n", type=positive_int, default=None, help="requests (short: 100, mixed: 500)")
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=None,
                        help="long: paper-scale prompt lengths (default 64K .. 1M)")
    parser.add_argument("--repeat", type=positive_int, default=1, help="long: each length this many times")
    parser.add_argument("--length", type=positive_int, default=None, help="short: one paper-scale length for all (4096/8192/16384)")
    parser.add_argument("--concurrency", type=nonnegative_int, default=None,
                        help="requests in flight (default: long 1, short all, mixed 16); 0 = unlimited")
    parser.add_argument("--rate", type=positive_float, default=None, help="Poisson arrivals per second (default: all at 0)")
    parser.add_argument("--pp", type=positive_int, default=2, help="pipeline ranks P")
    parser.add_argument("--folds", type=positive_int, default=1, help="folds of the V")
    parser.add_argument("--layers", type=positive_int, default=8, help="model layers")
    parser.add_argument("--chunk-size", type=positive_int, default=1024, help="chunk size (DCPP: budget), scaled tokens")
    parser.add_argument("--dcpp-mode", "--dcpp", dest="dcpp", default=DEFAULT_VARIANT, choices=VARIANTS,
                        help="DCPP planner: the engine (and commit) it reproduces, see vpp.schedules.dcpp")
    parser.add_argument("--dcpp-min-chunk", type=positive_int, default=None,
                        help="DCPP floor on a chunk, scaled tokens (default: the mode's, e.g. vLLM-Ascend 4096 "
                             "clamped to the budget, which leaves no room to shrink below a 4096-token budget)")
    parser.add_argument("--shared-budget", action="store_true",
                        help="one token budget per step shared by the requests (vLLM's batch): a request's tail "
                             "and the next one's first chunk fill a step together")
    parser.add_argument("--strategies", nargs="+", default=None, help="subset of cpp dcpp vpp vpp-async vpp-packed (and the variants cpp-async dcpp-async vpp-async-pipelined)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def workload_from_args(args):
    from vpp.schedules import workloads as W

    k = args.concurrency
    kw = {} if k is None else {"concurrency": None if k == 0 else k}
    if args.workload == "long":
        return W.long(args.scale, args.lengths or W.LONG_LENGTHS, repeat=args.repeat, rate=args.rate,
                      seed=args.seed, **kw)
    if args.workload == "short":
        return W.short(args.scale, args.seed, n=args.n or 100, length=args.length, rate=args.rate, **kw)
    return W.mixed(args.scale, args.seed, n=args.n or 500, rate=args.rate, **kw)


def check(args) -> None:
    from vpp.schedules import strategies as registry
    from vpp.schedules.stream_comparison import EXTRA
    from vpp.schedules.layout import make_layout

    try:
        args.strategy_names = registry.parse(args.strategies or registry.PLANNED, registry.PLANNED + EXTRA)
    except ValueError as exc:
        raise UsageError(f"--strategies: {exc}") from None
    check_workload_options(args.workload, {"--n": (args.n, ("short", "mixed")),
                                           "--lengths": (args.lengths, ("long",)),
                                           "--repeat": (args.repeat if args.repeat != 1 else None, ("long",)),
                                           "--length": (args.length, ("short",))})
    try:
        make_layout("v", args.layers, args.pp, folds=args.folds)
        args.workload_obj = workload_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    check_chunk_count(args.workload_obj.lengths, args.chunk_size, stages=2 * args.pp * args.folds)


def run(args) -> int:
    from vpp.schedules.stream_comparison import StreamSetup, compare, format_effect, format_table, packing_effect

    strategies = args.strategy_names
    workload = args.workload_obj
    setup = StreamSetup(pp=args.pp, layers=args.layers, folds=args.folds, chunk_size=args.chunk_size,
                        dcpp_variant=args.dcpp, dcpp_min_chunk=args.dcpp_min_chunk,
                        shared_budget=args.shared_budget)
    rows = compare(setup, workload, strategies)
    if args.json:
        out = {"workload": workload.describe(), "setup": {"pp": args.pp, "folds": args.folds, "layers": args.layers,
                                                          "chunk_size": args.chunk_size, "dcpp": args.dcpp},
               "rows": {name: r.to_dict() for name, r in rows.items()}}
        if "vpp-async" in rows and "vpp-packed" in rows:
            out["packing"] = packing_effect(rows)
        print(json.dumps(out, indent=2))
        return 0
    print(f"{workload.describe()}\npp={args.pp}, folds={args.folds}, {args.layers} layers, chunks of "
          f"{args.chunk_size} tokens, this machine's per-layer cost model\n")
    print(format_table(rows))
    effect = format_effect(rows)
    if effect:
        print("\n" + effect)
    return 0


__all__ = ["WORKLOADS", "add_arguments", "check", "run", "workload_from_args"]
