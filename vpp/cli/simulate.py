"""``python -m vpp simulate``: CPP, VPP and VPP-Async on the same model and prompt(s), side by side.

Example::

    python -m vpp simulate --pp 2 --layout v --seq-len 131072 --chunk-size 16384 --cost flops
    python -m vpp simulate --pp 4 --layout v --folds 2 --seq-len 65536 --chunk-size 8192 --json \\
        --trace-dir out/ --png-dir out/

CPP runs a loop layout (one stage per rank) of the same layers; VPP and VPP-Async run ``--layout``.
The linear cost is the paper's Eq. 2 per layer (``--t`` seconds per layer for the first chunk, growing
by ``--t`` per chunk of prefix); the flops cost is :class:`~vpp.schedules.cost.FlopCost` with a
generic 7B-class dense layer. Transfers move ``--hidden`` bf16 values per token over ``--bandwidth``.

``--model`` (a named model of :func:`vpp.perf.configs.get_arch`, a config.json path, or a tiny model)
replaces both with the model's own cost on a ``--device`` preset (``--calibration``: ``vpp calibrate``'s
file for ``cpu``): :class:`~vpp.perf.cp.ContextParallelCost`, each stage on ``--cp`` context-parallel
ranks of ``--tp`` devices (the ring's variant per chunk by Meta's rule, as the runtime's
``--cp-attention auto``)::

    python -m vpp simulate --model deepseek-v3.1 --device h100 --tp 8 --cp 2 --pp 2 --seq-len 524288 \
        --chunk-size 16384
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
    parser.add_argument("--model", default=None,
                        help="the cost of this model (a named model, a config.json path or tiny-*) instead of --cost")
    parser.add_argument("--device", default="cpu", help="with --model: device preset (h100, h200, 910c, cpu)")
    parser.add_argument("--calibration", default=None, help="with --model: a `vpp calibrate` JSON for the preset")
    parser.add_argument("--tp", type=positive_int, default=1, help="with --model: tensor-parallel devices per rank")
    parser.add_argument("--cp", type=positive_int, default=1,
                        help="with --model: context-parallel ranks per stage (each of --tp devices)")
    parser.add_argument("--dtype-bytes", type=positive_int, default=2, help="with --model: bytes per value")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--trace-dir", default=None, help="write <plan>.trace.json and <plan>.chrome.json here")
    parser.add_argument("--png-dir", default=None, help="write <plan>.png timelines here (needs matplotlib)")


def _arch(args):
    """The --model's cost-model view (None without --model)."""
    if args.model is None:
        return None
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.perf.arch import Arch
    from vpp.perf.configs import get_arch
    if args.model in TINY_CONFIGS:
        return Arch.from_config(TINY_CONFIGS[args.model], name=args.model)
    try:
        return get_arch(args.model)
    except (KeyError, OSError, ValueError) as exc:
        raise UsageError(f"--model {args.model}: {exc}") from None


def _layers(args, stages: int) -> int:
    arch = _arch(args)
    return arch.layers if arch is not None else args.layers or 4 * stages


def check(args) -> None:
    from vpp.schedules.layout import make_layout

    stages = args.pp * (1 if args.layout == "loop" else 2 * args.folds)
    check_chunk_count(args.seq_len, args.chunk_size, stages=stages)
    if args.model is None and (args.cp > 1 or args.tp > 1):
        raise UsageError(f"--cp {args.cp} --tp {args.tp} need --model (the generic --cost has no attention or "
                         f"heads to split)")
    if args.model is not None:
        from vpp.perf.hardware import get_device
        try:
            get_device(args.device, args.calibration)
        except (KeyError, OSError, ValueError) as exc:
            raise UsageError(f"--device {args.device}: {exc}") from None
        arch = _arch(args)
        if arch.attention == "dsa" and args.cp > 1:
            raise UsageError(f"--cp {args.cp}: {arch.name}'s sparse attention (DSA) is not in the CP cost model")
        if any(n < 2 * args.cp for n in args.seq_len) or args.chunk_size < 2 * args.cp:
            raise UsageError(f"--cp {args.cp} splits each chunk into {2 * args.cp} pieces: --chunk-size "
                             f"{args.chunk_size} and every --seq-len must be at least that")
    try:
        make_layout(args.layout, _layers(args, stages), args.pp, folds=args.folds if args.layout != "loop" else 1)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for option, folder, suffixes in (("--trace-dir", args.trace_dir, (".trace.json", ".chrome.json")),
                                     ("--png-dir", args.png_dir, (".png",))):
        if folder:
            writable_files_in(folder, [p.lower() + s for p in _labels() for s in suffixes], option)


def _cost(args, layout):
    from vpp.schedules.cost import FlopCost, LinearCost, seconds_per_token

    if args.model is not None:
        from vpp.perf.cp import ContextParallelCost
        from vpp.perf.hardware import get_device
        from vpp.perf.ops import Parallel
        b = args.dtype_bytes
        par = Parallel(tp=args.tp, act_bytes=b, weight_bytes=b, kv_bytes=b)
        return ContextParallelCost(_arch(args), get_device(args.device, args.calibration), layout, par, cp=args.cp,
                                   ring="rule")
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
    layers = _layers(args, stages)
    vpp_layout = make_layout(args.layout, layers, args.pp, folds=args.folds if args.layout != "loop" else 1)
    cpp_layout = make_layout("loop", layers, args.pp)
    runs = {}
    for name in COMPARED:
        spec = strategies.get(name)
        layout = cpp_layout if spec.layout == "loop" else vpp_layout
        runs[spec.label] = simulate(name, layout, args.seq_len, _cost(args, layout), chunk_size=args.chunk_size,
                                    check=True)
    requests = runs[strategies.get(COMPARED[0]).label].requests
    cost_name = args.cost if args.model is None else \
        f"{args.model} on {args.device}, tp={args.tp} x cp={args.cp} per stage"
    traces = {label: sim.trace for label, sim in runs.items()}
    summaries = {name: summarize(tr) for name, tr in traces.items()}
    written: list[str] = []
    for folder, write in ((args.trace_dir, _write_traces), (args.png_dir, _write_pngs)):
        if folder:
            os.makedirs(folder, exist_ok=True)
            written += write(folder, traces)
    if args.json:
        print(summaries_json(summaries, layout=vpp_layout.describe(), requests=[q.chunk_sizes for q in requests],
                             cost=cost_name))
    else:
        print(f"{vpp_layout.describe()}\n{len(requests)} request(s), chunks of {args.chunk_size} tokens, "
              f"{cost_name} cost\n")
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
