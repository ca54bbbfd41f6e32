"""The ``vpp`` command. Each sub-command lives in its own module that defines
``add_arguments(parser)`` and ``run(args) -> int`` (and optionally ``check(args)``, run in this
process before any rank starts); this file only dispatches and reports.

Every problem is one line on stderr, ``vpp <command>: error: ...``: argument and configuration
problems (found before any rank starts) exit 2, failures while running exit 1, Ctrl-C exits 130.
``--debug`` shows the traceback as well. Under torchrun a failed rank exits at once after its line
(``os._exit``): a transfer stuck in a dead peer would otherwise keep the process alive, and torchrun
stops the other ranks when one exits; a rank that fails before the ranks start also tells the
ranks waiting for it at the rendezvous (on other nodes torchrun would not stop them). The arguments
as given go to ``launch(same=...)``, a model directory as the digest of what it holds
(:func:`~vpp.cli.checks.loaded_identity`): nodes started with different ones, or whose ``--model`` holds
another checkpoint, are refused on every rank.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from vpp.cli.args import UsageError
from vpp.cli.checks import loaded_identity
from vpp.cli.terminal import setup_logging

# name -> (module, one-line help). Command modules stay light: heavy imports happen inside run().
COMMANDS: dict[str, tuple[str, str]] = {
    "prefill": ("vpp.cli.prefill", "run prefill schedules on real ranks and compare them"),
    "generate": ("vpp.cli.generate", "prefill a prompt with one schedule, then decode new tokens"),
    "serve-bench": ("vpp.cli.serve_bench", "prefill a request stream on real ranks under every strategy"),
    "simulate": ("vpp.cli.simulate", "simulate CPP, VPP and VPP-Async side by side (Table 2 numbers)"),
    "serve-sim": ("vpp.cli.serve_sim",
                  "simulate a request stream (short/long/mixed) under CPP, DCPP, VPP, VPP-Async and packing"),
    "calibrate": ("vpp.cli.calibrate", "time this CPU and a tiny model to fill the 'cpu' device preset"),
    "tune": ("vpp.cli.tune", "pick layout, folds, partition and chunk size by simulation (paper-scale cost model)"),
    "kernels": ("vpp.cli.kernels", "which kernel runs each op of a layer on this machine's CPU, and why"),
}


__all__ = ["COMMANDS", "build_parser", "main"]


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default (``(default: ...)``) except where there is none to show."""

    def _get_help_string(self, action):
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage problem is one line (``vpp <command>: error: ...``) and exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message, prog=self.prog)


def build_parser(command: str | None = "*") -> argparse.ArgumentParser:
    """Every command's options (``"*"``), or only ``command``'s (None: none), so that ``vpp --version``
    and ``vpp --help`` import no command module (and no torch, numpy or schedules)."""
    from vpp import __version__
    parser = _Parser(prog="vpp", description="Virtual Pipeline Parallelism for long-context chunked prefill. "
                     "Run 'vpp COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"vpp {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND",
                                title="commands")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_Help)
        p.add_argument("--debug", action="store_true", help="show tracebacks")
        p.set_defaults(_module=module)
        if command in ("*", name):
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # bare `vpp`: what it can do, not an error
        build_parser(None).print_help()
        return 0
    debug = "--debug" in argv
    prog = "vpp"
    try:
        args = build_parser(next((a for a in argv if a in COMMANDS), None)).parse_args(argv)
        prog = f"vpp {args.command}"
        # the arguments as given: under torchrun every rank (of every node) must have the same (launch's `same`)
        args._given = {"--" + k.replace("_", "-"): v for k, v in vars(args).items() if k not in ("_module", "debug")}
        setup_logging()
        module = importlib.import_module(args._module)
        from vpp.cli.aliasing import reading
        with reading(args, UsageError):  # every output path the check accepts is none of the run's inputs
            if hasattr(module, "check"):
                module.check(args)
        if _under_torchrun():  # nodes agree on what they load, not on its path
            args._given.update(loaded_identity(args))
        return int(module.run(args) or 0)
    except UsageError as exc:
        return _fail(exc.prog or prog, str(exc), 2, debug)
    except KeyboardInterrupt:
        return _fail(prog, "interrupted", 130, debug)
    except Exception as exc:  # noqa: BLE001 -- every failure becomes one line
        return _fail(prog, _summary(exc), 1, debug)


def _summary(exc: BaseException) -> str:
    """The first line of the error (a failed rank's ``summary`` when it has one)."""
    text = (getattr(exc, "summary", None) or str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _fail(prog: str, message: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    if _under_torchrun():
        from vpp.parallel.spawn import announce_start_failure
        announce_start_failure(f"{prog}: error: {message}")  # peers still waiting at the start stop now
        sys.stdout.flush()
        os._exit(code)
    return code


def _under_torchrun() -> bool:
    from vpp.parallel.spawn import launched_by_torchrun
    return launched_by_torchrun()


if __name__ == "__main__":
    sys.exit(main())
