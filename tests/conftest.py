"""Suite-wide rules.

* Tiers: ``python -m pytest -m "not slow"`` is the fast inner loop (pure and single-process tests);
  every test that starts a process (spawned ranks, torchrun, a subprocess) is marked ``slow``. A test
  that is not marked slow and starts one fails, naming the mark it needs.
* Nothing is left behind: after each test, no child process of this one may still run (the ranks of
  the session's persistent worlds excepted: ``worlds`` below, tests/worlds.py, ended at session end).
* Hermetic caches: matplotlib gets a configuration/cache directory of the session's own, and its font
  cache is built once before any test (building it runs ``fc-list``, a process, which the rule above
  would refuse in whichever fast test happened to import matplotlib first).
"""

from __future__ import annotations

import multiprocessing.process
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from tests.worlds import LIVE, Worlds


def _children() -> set[int]:
    """Live child processes of this pytest process, and of its rank server (spawned ranks are forks
    of it: vpp.parallel.spawn.rank_context) (Linux /proc; empty elsewhere)."""
    me, parents, out = os.getpid(), {}, set()
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry)] = int(fields[1])
    except FileNotFoundError:
        return out
    servers = set()
    for pid, parent in parents.items():
        if parent != me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"resource_tracker" in cmd:  # multiprocessing's one shared helper, not a rank
            continue
        if b"multiprocessing.forkserver" in cmd:  # the rank server lives for the session: its children count
            servers.add(pid)
            continue
        out.add(pid)
    out |= {pid for pid, parent in parents.items() if parent in servers}
    return out - LIVE  # a persistent world's rank (tests/worlds.py): the session ends it


def pytest_configure(config):
    config._vpp_mpl_dir = tempfile.mkdtemp(prefix="vpp-tests-mpl-")
    os.environ["MPLCONFIGDIR"] = config._vpp_mpl_dir  # spawned ranks and subprocesses inherit it
    # what the suite's rank functions import, imported once by the rank server instead of by every rank
    from vpp.parallel.spawn import preload
    preload("pytest", "transformers", "tests.models.hf_tiny", "tests.worlds")
    # vpp's CPU attention kernel is compiled at its first use (a compiler process, into the cache
    # directory): compile it here, once, so no test (and no rank) is the one that happens to build it
    from vpp.transformer import cpu_ops
    from vpp.transformer.attention import cpu_kernel
    cpu_kernel.library()
    cpu_ops.library()  # and the MoE / RMSNorm / RoPE kernels (vpp.transformer.cpu_ops)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.font_manager  # noqa: F401  (builds the font cache now, fc-list included)
    except ImportError:
        pass


def pytest_unconfigure(config):
    shutil.rmtree(getattr(config, "_vpp_mpl_dir", ""), ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _resource_tracker(request):
    """multiprocessing's resource tracker and vpp's rank server (a forkserver) are helper processes
    started by the first spawned queue or rank and kept for the session: when slow tests will run,
    start them before any test, so neither is counted as a process some test left behind (whichever
    test happens to spawn ranks first)."""
    if any(item.get_closest_marker("slow") for item in request.session.items):
        from multiprocessing import forkserver, resource_tracker
        from vpp.parallel.spawn import rank_context
        resource_tracker.ensure_running()
        if rank_context().get_start_method() == "forkserver":
            forkserver.ensure_running()
    yield


@pytest.fixture(scope="session")
def worlds():
    """Persistent gloo worlds, one per size (tests/worlds.py): ``worlds.run(size, fn, *args, timeout=...)``
    runs ``fn(rank, size, *args)`` on ranks spawned once per session. Only for slow tests."""
    pool = Worlds()
    yield pool
    pool.close()


@pytest.fixture(autouse=True)
def _process_rules(request, monkeypatch):
    slow = request.node.get_closest_marker("slow") is not None
    if not slow:
        def refuse(*_a, **_k):
            raise RuntimeError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.slow")
        monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
        monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    before = _children()
    yield
    left = _children() - before
    deadline = time.monotonic() + 20  # a stopped rank may take a moment to be reaped on a loaded machine
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _children() - before
    if left:
        pytest.fail(f"{request.node.nodeid} left child processes running: {sorted(left)}", pytrace=False)
