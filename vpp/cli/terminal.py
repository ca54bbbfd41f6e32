"""What the commands show on the terminal besides their results: log lines and progress bars.

Library code logs through module loggers (``logging.getLogger(__name__)``) and never prints; the
commands turn those records into lines on stderr. Spawned ranks are fresh interpreters, so each
command's rank function calls :func:`setup_logging` as well.
"""

from __future__ import annotations

import logging
import sys


def setup_logging(level: int = logging.INFO) -> None:
    """Send vpp's log records to stderr as plain lines (idempotent)."""
    root = logging.getLogger("vpp")
    if not any(getattr(h, "_vpp_cli", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._vpp_cli = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)


def progress_bar(label: str, total: int):
    """A callback ``show(done)`` drawing ``label [#####.....] done/total chunks`` on stderr when stderr
    is a terminal; otherwise (a log file, a pipe) one plain line when the step is done, never ``\r``."""
    if not sys.stderr.isatty():
        def line(done: int) -> None:
            if done >= total:
                print(f"  {label}: {done}/{total} chunks", file=sys.stderr, flush=True)
        return line

    def show(done: int) -> None:
        width = 30
        filled = int(width * done / max(total, 1))
        print(f"\r  {label:<28} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} chunks",
              end="\n" if done >= total else "", file=sys.stderr, flush=True)
    return show


__all__ = ["progress_bar", "setup_logging"]
