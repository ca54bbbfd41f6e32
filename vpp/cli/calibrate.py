"""``vpp calibrate``: fill the "cpu" device preset from timings of this machine and a tiny model.

    vpp calibrate [--model tiny-deepseek] [--tokens 4096] [--chunk 512] [--threads 1] [--link]
                  [--out benchmarks/results/cpu_calibration.json]

Then ``vpp tune --device cpu --calibration benchmarks/results/cpu_calibration.json ...`` (or
``get_device("cpu", calibration=path)``) uses the timed constants. See :mod:`vpp.cli.calibration`.
"""

from __future__ import annotations

import json
import os

from vpp.cli.args import UsageError, positive_int, writable_dir, writable_file
from vpp.safe_write import write_text


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="tiny-deepseek", choices=("tiny-qwen", "tiny-deepseek", "tiny-glm"),
                        help="the tiny model timed")
    parser.add_argument("--tokens", type=positive_int, default=4096, help="prompt tokens timed")
    parser.add_argument("--chunk", type=positive_int, default=512, help="tokens per chunk")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    parser.add_argument("--runs", type=positive_int, default=3, help="prefills to time (median per chunk)")
    parser.add_argument("--check", action="store_true",
                        help="also predict the other tiny models with the calibrated device (no re-fit)")
    parser.add_argument("--link", action="store_true", help="also time gloo send/recv between two processes")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "cpu_calibration.json"),
                        help="where the fitted preset is written (JSON)")


def check(args) -> None:
    from vpp.cli.memory_check import check_positions
    from vpp.models import model_config
    from vpp.models.tiny import TINY_CONFIGS
    if args.chunk > args.tokens:
        raise UsageError(f"--chunk {args.chunk} is longer than --tokens {args.tokens}")
    check_positions(model_config(TINY_CONFIGS[args.model]), args.tokens, f"--tokens {args.tokens}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        writable_dir(os.path.dirname(os.path.abspath(args.out)), "--out")  # created at the end
    else:
        writable_file(args.out, "--out")


def run(args) -> int:
    from vpp.cli.calibration import calibrate  # torch: only when it runs (vpp --help answers without it)
    from vpp.models.tiny import TINY_CONFIGS
    check = tuple(TINY_CONFIGS) if args.check else ()
    result = calibrate(args.model, args.tokens, args.chunk, threads=args.threads, runs=args.runs, link=args.link,
                       check=check)
    dev, val = result["device"], result["validation"]
    print(f"this CPU ({args.threads} thread(s)): GEMM {dev['peak_flops'] / 1e9:.1f} GFLOP/s, copy "
          f"{dev['mem_bw'] / 1e9:.1f} GB/s, link {dev['link_bw'] / 1e9:.2f} GB/s, attention at "
          f"{dev['eff_attn']:.2f} of GEMM rate, {dev['kernel_overhead'] * 1e6:.1f} us per kernel")
    print(f"{val['model']}: {val['tokens']} tokens in {val['chunk']}-token chunks; cost model vs measured: "
          f"mean |error| {100 * val['mean_abs_error']:.1f}%, max {100 * val['max_abs_error']:.1f}%, "
          f"last/first chunk {val['last_over_first_measured']:.2f} measured, {val['last_over_first_predicted']:.2f} "
          f"predicted")
    for c in result["cross_check"]:
        print(f"{c['model']} predicted with these constants (no re-fit): mean |error| {100 * c['mean_abs_error']:.1f}%, "
              f"max {100 * c['max_abs_error']:.1f}%, last/first {c['last_over_first_measured']:.2f} measured, "
              f"{c['last_over_first_predicted']:.2f} predicted")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_text(args.out, json.dumps(result, indent=1), option="--out")
    print(f"wrote {args.out}")
    return 0


__all__ = ["add_arguments", "check", "run"]
