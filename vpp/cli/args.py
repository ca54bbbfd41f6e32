"""Argument types and checks shared by the commands: every problem becomes one :class:`UsageError`
line before any rank starts."""

from __future__ import annotations

import argparse
import os


class UsageError(Exception):
    """A problem with the command line or the files it names: reported as one line, exit code 2."""

    def __init__(self, message: str, prog: str | None = None):
        super().__init__(message)
        self.prog = prog


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def nonnegative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = _float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def nonnegative_float(text: str) -> float:
    value = _float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def fraction(text: str) -> float:
    value = _float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {text}")
    return value


def fraction_list(text: str) -> tuple[float, ...]:
    """Comma-separated fractions in (0, 1] (a taper's ramp, in budgets: "0.25,0.75")."""
    try:
        values = tuple(fraction(t.strip()) for t in text.split(",") if t.strip())
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"must be comma-separated fractions in (0, 1] ({exc})") from None
    if not values or 0 in values:
        raise argparse.ArgumentTypeError(f"must be comma-separated fractions in (0, 1], got {text!r}")
    return values


def int_list(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers."""
    try:
        return tuple(positive_int(t.strip()) for t in text.split(",") if t.strip()) or _empty(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1 ({exc})") from None


def _empty(text: str):
    raise argparse.ArgumentTypeError(f"must name at least one integer, got {text!r}")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def writable_file(path: str, option: str) -> str:
    """``path`` is a new or writable regular file (a symlink is followed to one): see
    :mod:`vpp.safe_write`. Returns the resolved path."""
    from vpp.safe_write import OutputPathError, check_output_file
    try:
        real = check_output_file(path, option)
    except OutputPathError as exc:
        raise UsageError(str(exc)) from None
    _refuse_input(path, option)
    return real


def _refuse_input(path: str, option: str, *, folder: bool = False) -> None:
    """An output that is one of the run's inputs (:mod:`vpp.cli.aliasing`) is refused."""
    from vpp.cli.aliasing import input_problem
    problem = input_problem(path, option, folder=folder)
    if problem:
        raise UsageError(problem)


def writable_files_in(folder: str, names, option: str) -> str:
    """``folder`` is (or can be created as) a writable folder, and each of ``names`` inside it that already
    exists is a writable regular file (or a symlink to one)."""
    real = writable_dir(folder, option)
    _refuse_input(folder, option, folder=True)
    for name in names:
        path = os.path.join(folder, name)
        if os.path.lexists(path):
            writable_file(path, option)
        else:
            _refuse_input(path, option)
    return real


def writable_dir(path: str, option: str) -> str:
    """``path`` is a writable folder, or can be created as one."""
    from vpp.safe_write import OutputPathError, check_output_dir
    try:
        return check_output_dir(path, option)
    except OutputPathError as exc:
        raise UsageError(str(exc)) from None


def check_workload_options(workload: str, given: dict) -> None:
    """Refuse a workload option given with a workload it does not shape (it would be ignored): ``given``
    maps an option to (its value, or None when not given; the workloads it applies to)."""
    for option, (value, applies) in given.items():
        if value is not None and workload not in applies:
            raise UsageError(f"{option} applies to --workload {' or '.join(applies)}, not {workload}")


MAX_SIM_COMPUTES = 200_000  # stage computes (stages x chunks) one simulation plans: ~90 s on one core


def check_chunk_count(lengths, chunk_size: int, option: str = "--chunk-size", *, stages: int = 4,
                      limit: int = MAX_SIM_COMPUTES, whose: str = "the simulator's limit") -> None:
    """Refuse a simulation of more than ``limit`` stage computes: ``lengths`` cut into chunks of
    ``chunk_size``, each chunk run on ``stages`` virtual stages (the plan, the simulation and the trace all
    grow with that product, faster than linearly where a rank holds many stages)."""
    chunks = sum(-(-int(n) // chunk_size) for n in lengths)
    if chunks * stages > limit:
        raise UsageError(f"{option} {chunk_size} cuts {sum(int(n) for n in lengths)} tokens into {chunks} chunks, "
                         f"{chunks * stages} stage computes over {stages} stages; {whose} is {limit} "
                         f"(use larger chunks, shorter prompts, fewer ranks or folds)")


__all__ = [
    "MAX_SIM_COMPUTES", "UsageError", "check_chunk_count", "check_workload_options", "fraction", "fraction_list", "int_list", "nonnegative_float",
    "nonnegative_int", "positive_float", "positive_int", "writable_dir", "writable_file",
    "writable_files_in",
]
