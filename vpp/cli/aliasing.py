"""No output of a run is one of its inputs: every path a command writes (``--save-logits``, ``--trace``,
``--save-kv``, ``--out``, ``--json FILE``, ...) is compared with every file and folder the run reads
(the model directory and every file in it: config, index, safetensors shards, tokenizer; a config file;
``--prompt-file``; a ``--load-kv`` directory and its files; ``--calibration``), by resolved path (every
symlink followed) and, where both exist, by device and inode (a hard link is the same file under
another name). A match is one line before any work (exit 2).

:func:`main <vpp.cli.main>` records the run's inputs (:func:`reading`) before the command's ``check``;
the output options (:data:`OUTPUT_OPTIONS`) are compared with them at once, and the output checks
every command goes through (:func:`vpp.cli.args.writable_file`, :func:`~vpp.cli.args.writable_files_in`:
the files a command writes inside an output folder too) refuse an output that is one of them.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

# argparse dests naming what a run reads: a file, or a folder whose files it reads
INPUT_OPTIONS = ("model", "prompt_file", "load_kv", "calibration")
# argparse dests naming what a run writes: a file (False) or a folder it writes files into (True)
OUTPUT_OPTIONS = {"save_logits": False, "out": False, "json": False, "save_kv": True, "trace": True,
                  "trace_dir": True, "png_dir": True}

_INPUTS: contextvars.ContextVar[tuple] = contextvars.ContextVar("vpp_run_inputs", default=())


def identity(path: str) -> tuple[str, tuple[int, int] | None]:
    """``path`` resolved (symlinks followed) and, when it exists, its (device, inode)."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return real, None
    return real, (st.st_dev, st.st_ino)


def run_inputs(args) -> list[tuple[str, str, bool]]:
    """``(option, path, is_folder)`` for every file and folder the command line makes the run read."""
    out = []
    for dest in INPUT_OPTIONS:
        value = getattr(args, dest, None)
        if not isinstance(value, str) or not os.path.exists(value):
            continue  # a built-in model's name, or a path the command's own check refuses
        option = "--" + dest.replace("_", "-")
        if not os.path.isdir(value):
            out.append((option, value, False))
            continue
        out.append((option, value, True))
        with contextlib.suppress(OSError):
            out.extend((option, e.path, False) for e in os.scandir(value) if e.is_file())
    return out


@contextlib.contextmanager
def reading(args, error=ValueError):
    """Within: the output checks refuse any of ``args``' inputs (:func:`run_inputs`); an output option that
    is one of them raises ``error`` at once."""
    token = _INPUTS.set(tuple((option, path, folder, identity(path)) for option, path, folder in run_inputs(args)))
    try:
        for dest, folder in OUTPUT_OPTIONS.items():  # at once, before the command's own checks read anything
            value = getattr(args, dest, None)
            problem = isinstance(value, str) and input_problem(value, "--" + dest.replace("_", "-"), folder=folder)
            if problem:
                raise error(problem)
        yield
    finally:
        _INPUTS.reset(token)


def input_problem(path: str, option: str, *, folder: bool = False) -> str | None:
    """Why writing ``path`` (a file, or with ``folder`` a folder the run writes into) would overwrite one
    of the run's inputs, or None."""
    real, inode = identity(path)
    for their_option, theirs, their_folder, (their_real, their_inode) in _INPUTS.get():
        if their_folder != folder:
            continue
        if real == their_real or (inode is not None and inode == their_inode):
            how = "is" if real == their_real else "is a hard link to"
            return (f"{option} {path} {how} {theirs}, which this run reads ({their_option}): an output may not "
                    f"replace an input; choose another path")
    return None


__all__ = ["INPUT_OPTIONS", "OUTPUT_OPTIONS", "identity", "input_problem", "reading", "run_inputs"]
