"""``python -m vpp simulate``: CPP, VPP and VPP-Async on the same model and prompt(s), side by side.

Example::

    python -m vpp simulate --pp 2 --layout v --seq-len 131072 --chunk-size 16384 --cost flops
    python -m vpp simulate --pp 4 --layout v --folds 2 --seq-len 65536 --chunk-size 8192 --json \\
        --trace-dir out/ --png-dir out/

CPP runs a loop layout (one stage per rank) of the same layers; VPP and VPP-Async run ``--layout``.
The linear cost is the paper's Eq. 2 per layer (``--t`` seconds per layer for the first chunk, growing
by ``--t`` per chunk of prefix); the flops cost is :class:`~vpp.schedules.cost.FlopCost` with a
generic 7B-class dense layer. Transfers move ``--hidden`` bf16 values per token over ``--bandwidth``.
"""

from __future__ import annotations

import argparse
import os
import sys

from vpp.cli.args import (UsageError, check_chunk_count, fraction, nonnegative_int, positive_float, positive_int,
                          writable_files_in)


COMPARED = ("cpp", "vpp", "vpp-async")  # CPP on a loop of the same layers; VPP and VPP-Async on --layout


def _labels() -> list[str]:
    from vpp.schedules import strategies
    return [strategies.get(name).label for name in COMPARED]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pp", type=positive_int, required=True, help="pipeline ranks P")
    parser.add_argument("--layout", default="v", choices=("v", "interleaved", "loop"), help="layout of the VPP plans")
    parser.add_argument("--folds", type=positive_int, default=1, help="folds of the V (2 = W); stages per rank = 2 x folds")
    parser.add_argument("--seq-len", type=positive_int, nargs="+", required=True, help="prompt length(s), one per request")
    parser.add_argument("--chunk-size", type=positive_int, required=True, help="tokens per chunk (the last is ragged)")
    parser.add_argument("--layers", type=nonnegative_int, default=0, help="model layers (default: 4 per VPP stage)")
    parser.add_argument("--cost", default="linear", choices=("linear", "flops"), help="compute cost model")
    parser.add_argument("--t", type=positive_float, default=None,
                        help="linear: seconds per layer for the first chunk (default: 5e-6 x chunk size)")
    parser.add_argument("--flops", type=positive_float, default=1e14, help="flops: sustained FLOP/s per rank")
    parser.add_argument("--hidden", type=positive_int, default=4096, help="hidden size (activation width)")
    parser.add_argument("--latency", type=positive_float, default=5e-5, help="seconds per transfer")
    parser.add_argument("--bandwidth", type=positive_float, default=3e9, help="bytes/s between ranks")
    parser.add_argument("--overlap", type=fraction, default=1.0, help="share of an async transfer that hides")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--trace-dir", default=None, help="write <plan>.trace.json and <plan>.chrome.json here")
    parser.add_argument("--png-dir", default=None, help="write <plan>.png timelines here (needs matplotlib)")


def check(args) -> None:
    from vpp.schedules.layout import make_layout

    stages = args.pp * (1 if args.layout == "loop" else 2 * args.folds)
    check_chunk_count(args.seq_len, args.chunk_size, stages=stages)
    try:
        make_layout(args.layout, args.layers or 4 * stages, args.pp, folds=args.folds if args.layout != "loop" else 1)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for option, folder, suffixes in (("--trace-dir", args.trace_dir, (".trace.json", ".chrome.json")),
                                     ("--png-dir", args.png_dir, (".png",))):
        if folder:
            writable_files_in(folder, [p.lower() + s for p in _labels() for s in suffixes], option)


def _cost(args, layout):
    from vpp.schedules.cost import FlopCost, LinearCost, seconds_per_token

    comm = dict(latency=args.latency, seconds_per_token=seconds_per_token(args.hidden, bandwidth=args.bandwidth),
                overlap=args.overlap)
    if args.cost == "flops":
        return FlopCost.for_layout(layout, hidden=args.hidden, flops_per_s=args.flops, **comm)
    t = args.t if args.t is not None else 5e-6 * args.chunk_size
    return LinearCost.eq2(t, args.chunk_size, stage_weights=tuple(float(n) for n in layout.partition), **comm)


def run(args) -> int:
    from vpp.schedules import strategies
    from vpp.schedules.layout import make_layout
    from vpp.schedules.runner import simulate
    from vpp.schedules.summary import format_summaries, summaries_json, summarize

    stages = args.pp * (1 if args.layout == "loop" else 2 * args.folds)
    layers = args.layers or 4 * stages
    vpp_layout = make_layout(args.layout, layers, args.pp, folds=args.folds if args.layout != "loop" else 1)
    cpp_layout = make_layout("loop", layers, args.pp)
    runs = {}
    for name in COMPARED:
        spec = strategies.get(name)
        layout = cpp_layout if spec.layout == "loop" else vpp_layout
        runs[spec.label] = simulate(name, layout, args.seq_len, _cost(args, layout), chunk_size=args.chunk_size,
                                    check=True)
    requests = runs[strategies.get(COMPARED[0]).label].requests
    traces = {label: sim.trace for label, sim in runs.items()}
    summaries = {name: summarize(tr) for name, tr in traces.items()}
    written: list[str] = []
    for folder, write in ((args.trace_dir, _write_traces), (args.png_dir, _write_pngs)):
        if folder:
            os.makedirs(folder, exist_ok=True)
            written += write(folder, traces)
    if args.json:
        print(summaries_json(summaries, layout=vpp_layout.describe(), requests=[q.chunk_sizes for q in requests],
                             cost=args.cost))
    else:
        print(f"{vpp_layout.describe()}\n{len(requests)} request(s), chunks of {args.chunk_size} tokens, "
              f"{args.cost} cost\n")
        print(format_summaries(summaries))
    if written:
        print("wrote " + ", ".join(written), file=sys.stderr)
    return 0


def _write_traces(folder: str, traces: dict) -> list[str]:
    written = []
    for name, tr in traces.items():
        for path, write in ((f"{name.lower()}.trace.json", tr.save), (f"{name.lower()}.chrome.json", tr.to_chrome)):
            write(os.path.join(folder, path))
            written.append(os.path.join(folder, path))
    return written


def _write_pngs(folder: str, traces: dict) -> list[str]:
    written = []
    for name, tr in traces.items():
        tr.plot(os.path.join(folder, f"{name.lower()}.png"), title=name)
        written.append(os.path.join(folder, f"{name.lower()}.png"))
    return written


__all__ = ["COMPARED", "add_arguments", "check", "run"]
