"""The study's independent pieces on several processes: :func:`pmap` maps a module-level function over
items in a pool of forked workers and returns the results in the items' order, so a report is the same
whatever ``jobs`` (each piece is pure: a simulation of its own setup, nothing shared but inputs).

``jobs`` <= 1 (or one item) runs in this process. :func:`default_jobs` is the CPUs this process may use.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Sequence


def default_jobs() -> int:
    """The CPUs this process may run on (its affinity where the system tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pmap(fn: Callable, items: Sequence, jobs: int = 1) -> list:
    """``[fn(x) for x in items]``, on up to ``jobs`` forked processes (``fn`` and the results picklable)."""
    items = list(items)
    if jobs <= 1 or len(items) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [fn(x) for x in items]
    with ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(fn, items))


__all__ = ["default_jobs", "pmap"]
