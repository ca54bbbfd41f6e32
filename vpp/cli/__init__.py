"""The ``vpp`` command. Each sub-command lives in its own module that defines
``add_arguments(parser)`` and ``run(args) -> int``; this file only dispatches."""

from __future__ import annotations

import argparse
import importlib
import sys

from vpp.cli.output import setup_logging

# name -> (module, one-line help). Command modules stay light: heavy imports happen inside run().
COMMANDS: dict[str, tuple[str, str]] = {
    "prefill": ("vpp.cli.prefill", "run prefill schedules on real ranks and compare them"),
    "serve-bench": ("vpp.cli.serve_bench", "prefill a request stream on real ranks under every strategy"),
    "simulate": ("vpp.cli.simulate", "simulate CPP, VPP and VPP-Async side by side (Table 2 numbers)"),
    "serve-sim": ("vpp.cli.serve_sim",
                  "simulate a request stream (short/long/mixed) under CPP, DCPP, VPP, VPP-Async and packing"),
    "calibrate": ("vpp.cli.calibrate", "time this CPU and a tiny model to fill the 'cpu' device preset"),
    "tune": ("vpp.cli.tune", "pick layout, folds, partition and chunk size by simulation (paper-scale cost model)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vpp", description="Virtual Pipeline Parallelism for chunked prefill")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
