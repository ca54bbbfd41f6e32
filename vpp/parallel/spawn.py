"""Starting ranks: under ``torchrun`` (env://) or spawned from one Python process.

:func:`~vpp.parallel.rendezvous.init_distributed` (:mod:`vpp.parallel.rendezvous`) is the one place that
reads the launcher's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``);
library code below it never does.
:func:`run_distributed` runs a function on N local processes (tests, the CLI without torchrun): each
rank's return value comes back; when any rank raises or dies, the call fails promptly with that rank's
traceback, and a rank that hangs past ``timeout`` fails it too. It never hangs.

Failure guarantees of spawned ranks:

* blame: an exception may name the rank at fault in a ``global_rank`` attribute (the watchdog's
  :class:`~vpp.runtime.watchdog.ExecutionError` does: a rank that timed out waiting for a peer names
  the peer). :class:`RankFailure` then carries that rank, not the one that waited;
* spawned ranks die with their parent: each asks the kernel for SIGKILL when its parent exits
  (Linux ``PR_SET_PDEATHSIG``), and also watches its parent process (other systems); SIGTERM and
  SIGINT (Ctrl-C) of the parent stop every rank before the call returns.

Devices. Every rank uses one device of its own and the backend that moves that device's tensors
(gloo for CPU, NCCL for CUDA, HCCL for NPU: :mod:`.device`); the local rank picks the card. A node
with fewer cards than local ranks is a clear error before any process group exists, never two ranks
on one card or gloo with device tensors.
"""

from __future__ import annotations

import ctypes
import math
import numbers
import os
import pickle
import queue
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Sequence, Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vpp.parallel.device import Accelerator, get_accelerator
from vpp.parallel.liveness import Heartbeat, exit_now
from vpp.parallel.rendezvous import (announce_failure, announce_start_failure, check_same_on_every_rank,
                                     first_failure, init_distributed, launched_by_torchrun, record_failure,
                                     write_error_file)


class RankFailure(RuntimeError):
    """A spawned rank raised, died or timed out. ``rank`` is the rank at fault: the one that raised
    or died first, or the one its peers named (a peer that timed out waiting for it)."""

    def __init__(self, rank: int | None, message: str, summary: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.summary = summary or message.strip().splitlines()[0]  # one line, for a command's error


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # no /proc (not Linux): kill(0) said it exists
        return True


def _die_with_parent(parent_pid: int) -> None:
    """Make this process end when ``parent_pid`` (the process that launched the ranks) does, SIGKILL
    included. A rank forked by the rank server (:func:`rank_context`) is the server's child, and the
    server exits when the launcher does: the kernel's parent-death signal covers the direct parent,
    and a watcher thread covers both (and other systems than Linux)."""
    if sys.platform.startswith("linux"):
        try:
            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except Exception:  # no libc prctl: the watcher thread below still applies
            pass
    direct = os.getppid()
    if not _alive(parent_pid) or (direct != parent_pid and not _alive(direct)) or direct == 1:
        os._exit(1)  # the parent died before the request took effect

    def watch() -> None:
        while os.getppid() == direct and _alive(parent_pid):
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="vpp-parent-watch", daemon=True).start()


# Where spawned ranks start from. Where the platform has one (Linux, macOS), a forkserver: a server
# process, started once per launching process, imports torch and vpp's rank-side modules once, and
# each rank is a fork of it: milliseconds, where a spawned rank starts an interpreter and imports
# torch (seconds of CPU each, paid by every rank of every launch). The server never runs a torch op,
# so a fork of it is as clean as a fresh interpreter (no OpenMP pool, no device context); each rank
# takes the launcher's current environment (:func:`_rank_main`), as a spawned one would.
PRELOAD = ("torch", "torch.distributed", "vpp.models", "vpp.runtime", "vpp.kv", "vpp.cli")
_preload: list[str] = list(PRELOAD)


def preload(*modules: str) -> None:
    """Add modules for the rank server to import once (those the function you launch imports, say);
    takes effect if called before the first rank of this process starts. A module that fails to import
    there is imported by each rank instead."""
    _preload.extend(m for m in modules if m not in _preload)


def rank_context():
    """The multiprocessing context spawned ranks start from: the forkserver (above), else spawn."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(_preload))
    return ctx


def check_device_count(acc: Accelerator, ranks: int, *, host_ids: Sequence[str] | None = None) -> None:
    """Raise unless this node has a device for each of ``ranks`` local ranks (always true on CPU). The one
    exception: CUDA ranks that each get their own ``NCCL_HOSTID`` (``host_ids``, one per rank, all set
    and different), which NCCL runs as hosts apart over sockets, several on one GPU (a correctness check
    of the NCCL path on a one-GPU machine: ``python -m vpp.testing.nccl_pair``)."""
    if acc.kind == "cuda" and host_ids is not None and len(host_ids) == ranks and all(host_ids) \
            and len(set(host_ids)) == ranks and acc.device_count >= 1:
        return
    if acc.kind != "cpu" and acc.device_count < ranks:
        raise RuntimeError(f"{ranks} ranks need one {acc.kind} device each, but {acc.device_count} "
                           f"{'is' if acc.device_count == 1 else 'are'} visible; start fewer ranks "
                           f"(tp * pp <= {acc.device_count}) or run on CPU (device 'cpu')")


def _rank_main(
    rank: int, world_size: int, init_file: str, fn: Callable, args: tuple, results: Any,
    threads: int, pg_timeout_s: float, kind: str, parent_pid: int, startup_timeout: float,
    environ: dict[str, str] | None = None,
) -> None:
    _die_with_parent(parent_pid)
    if environ is not None:  # the launcher's environment now, not the rank server's from when it started
        os.environ.clear()
        os.environ.update(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent stops us
    try:
        torch.set_num_threads(threads)
        init_distributed(
            get_accelerator(kind), init_method=f"file://{init_file}", rank=rank, world_size=world_size,
            local_rank=rank, timeout_s=pg_timeout_s, startup_timeout_s=startup_timeout,
        )
        results.put((rank, _UP, None, None))  # running: the parent's run deadline counts from here
        value = fn(rank, world_size, *args)
        # plain pickle copies tensors by value: torch's queue would pass shared-memory handles that
        # die with this process before the parent reads them
        results.put((rank, True, pickle.dumps(value), None))
    except BaseException as exc:  # noqa: BLE001 -- report everything, including KeyboardInterrupt
        blamed = getattr(exc, "global_rank", None)
        results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", blamed))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def check_launch(world_size: Any, **timeouts: Any) -> None:
    """One line before any process starts: ``world_size`` an integer >= 1 (0 ranks ran nothing and
    returned ``[]``), every timeout a finite number of seconds > 0 (NaN never expired; None: the default)."""
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an integer >= 1")
    for name, value in timeouts.items():
        if value is None and name == "pg_timeout_s":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
            raise ValueError(f"{name}={value!r} must be a finite number of seconds > 0")


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    threads: int = 1,
    pg_timeout_s: float | None = None,
    device: str | None = "cpu",
    startup_timeout: float = 300.0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes of this node: CPU
    ranks on gloo by default; ``device="cuda"``/``"npu"`` (or ``None``: whatever this machine has) puts
    rank r on card r with NCCL/HCCL, and raises at once when there are fewer cards than ranks.

    ``fn`` and ``args`` must be picklable (a module-level function). Returns the per-rank return
    values in rank order. Raises :class:`RankFailure` with the failing rank's traceback as soon as a
    rank raises or exits without reporting, or when ``timeout`` seconds pass.

    Deadlines count from when the ranks run, not from the spawn: start-up (interpreters, imports, the
    rendezvous) has ``startup_timeout`` seconds until every rank has initialised its process group,
    and the run has ``timeout`` seconds from the moment the last rank did. A machine slow to start
    interpreters therefore never eats the run's time, and a rank is blamed for a hang only once it
    ran. (A rank stuck in the rendezvous because a peer never came fails by itself after
    ``pg_timeout_s``.)
    """
    check_launch(world_size, timeout=timeout, startup_timeout=startup_timeout, pg_timeout_s=pg_timeout_s)
    acc = get_accelerator(device)
    check_device_count(acc, world_size)
    ctx = rank_context()
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="vpp-rdzv-") as tmp, _stop_on_sigterm():
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(
                target=_rank_main,
                args=(r, world_size, init_file, fn, args, results, threads, pg_timeout_s or timeout, acc.kind,
                      os.getpid(), startup_timeout, dict(os.environ)),
                daemon=True,
            )
            for r in range(world_size)
        ]
        try:
            for p in procs:
                p.start()
            return _collect(procs, results, world_size, timeout, startup_timeout)
        finally:
            _stop(procs)


def _stop(procs: list) -> None:
    for p in procs:
        if p.pid is not None and p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3
    for p in procs:
        if p.pid is None:
            continue
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(2)


class _stop_on_sigterm:
    """While spawned ranks run, SIGTERM of this (main-thread) process raises KeyboardInterrupt, so
    the ranks are stopped by the ``finally`` above before the process exits."""

    def __enter__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            def interrupt(signum, frame):
                raise KeyboardInterrupt(f"signal {signum}")
            self.previous = signal.signal(signal.SIGTERM, interrupt)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


_UP = "up"  # a rank's first message: it runs (process group initialised), the run deadline starts


def _collect(procs: list, results: Any, world_size: int, timeout: float, startup_timeout: float) -> list[Any]:
    start_deadline = time.monotonic() + startup_timeout  # until every rank runs (see run_distributed)
    run_deadline: float | None = None
    up: set[int] = set()
    values: dict[int, Any] = {}
    dead_since: dict[int, float] = {}
    while len(values) < world_size:
        try:
            rank, ok, value, blamed = results.get(timeout=0.1)
        except queue.Empty:
            now = time.monotonic()
            for r, p in enumerate(procs):
                if r not in values and not p.is_alive():
                    # give its last message a moment to arrive through the queue's pipe
                    if now - dead_since.setdefault(r, now) > 2.0:
                        raise RankFailure(r, f"rank {r} exited with code {p.exitcode} without reporting")
            if run_deadline is None and now > start_deadline:
                late = sorted(set(range(world_size)) - up)
                raise RankFailure(late[0], f"ranks {late} of {world_size} did not start running within "
                                           f"{startup_timeout:.0f}s of being spawned (interpreter start-up or "
                                           f"rendezvous)")
            if run_deadline is not None and now > run_deadline:
                missing = sorted(set(range(world_size)) - set(values))
                raise RankFailure(
                    missing[0] if missing else None,
                    f"timed out after {timeout:.0f}s of running waiting for ranks {missing} of {world_size}",
                )
            continue
        if ok == _UP:
            up.add(rank)
            if len(up) == world_size:
                run_deadline = time.monotonic() + timeout
            continue
        if not ok:
            _raise_root_failure(procs, results, world_size, {rank: (value, blamed)}, values)
        values[rank] = pickle.loads(value)
    return [values[r] for r in range(world_size)]


def _raise_root_failure(procs, results, world_size, failures: dict[int, tuple], values: dict) -> None:
    """A rank failed. Its peers often fail a moment later (connection reset) or it was itself
    collateral of a rank that died silently; wait briefly and blame the root cause: a rank that
    died without reporting, else a rank the failures name (``global_rank``), else the first rank
    that reported an error."""
    grace = time.monotonic() + 1.5
    while time.monotonic() < grace:
        try:
            rank, ok, value, blamed = results.get(timeout=0.1)
        except queue.Empty:
            continue
        if ok == _UP:
            continue
        (failures.setdefault(rank, (value, blamed)) if not ok else values.setdefault(rank, pickle.loads(value)))
    named = [b for _, b in failures.values() if b is not None and b not in failures]
    first = next(iter(failures))
    silent = [r for r, p in enumerate(procs) if r not in failures and r not in values and not p.is_alive()]
    if silent:
        r = silent[0]
        others = ", ".join(f"rank {k}" for k in failures)
        raise RankFailure(r, f"rank {r} exited with code {procs[r].exitcode} without reporting "
                             f"(then {others} failed)")
    details = "\n".join(f"--- rank {r} ---\n{msg}" for r, (msg, _) in failures.items() if r != first)
    if named:
        head = f"rank {named[0]} of {world_size} failed (named by rank {first})"
    else:
        head = f"rank {first} of {world_size} failed"
    message = f"{head}:\n{failures[first][0]}"
    if details:
        message += f"\nother ranks failed afterwards:\n{details}"
    raise RankFailure(named[0] if named else first, message, f"{head}: {failures[first][0].splitlines()[0]}")


def launch(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 3600.0,
           threads: int = 1, pg_timeout_s: float | None = None, device: str | None = None,
           same: dict | None = None) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on every rank: in this process when started by torchrun
    (one rank per process, any number of nodes), else on ``world_size`` spawned ranks of this node.
    Returns the same shape both ways: a list indexed by global rank, one entry per rank of the world
    (``launch(...)[0]`` is global rank 0's value). Spawned, this process holds every rank's value;
    under torchrun each process holds only its own, and the other entries are None (values are not
    sent between ranks: each process reports what it computed). ``device``: ``"cpu"``,
    ``"cuda"``, ``"npu"`` or ``None`` (this machine's accelerator if it has one), one device per rank
    and the backend that goes with it, under torchrun and spawned alike. ``pg_timeout_s`` bounds every
    collective of the process group (default: ``timeout``).

    Under torchrun a failure propagates and the process group is not torn down (a transfer stuck in
    a dead peer would block the teardown): the caller exits, and torchrun stops the other ranks. Each
    rank dies with its torchrun (SIGKILL of the launcher included), as spawned ranks die with their parent.
    Across nodes, where torchrun tells nobody: from the start-up rendezvous on, ranks beat a heartbeat
    through the rendezvous store (:mod:`vpp.parallel.liveness`), so a rank that dies (even while the
    others wait for it to load a checkpoint) stops every other rank within seconds, naming it (an error
    of a transfer that lost its peer becomes :class:`RankFailure` naming the rank that died); and the
    first failure is recorded for torchrun's summary (:func:`record_failure`), so that its "Root Cause"
    is the rank that failed first, not a rank that stopped because of it.

    ``same``: values every rank must be started with (a command's arguments). Ranks that torchrun
    started on several nodes each parse their own command line; before ``fn`` runs they compare
    ``same`` (:func:`check_same_on_every_rank`), and any difference fails every rank with one line
    naming the ranks and keys. Spawned ranks share one by construction."""
    if launched_by_torchrun():
        check_launch(1, timeout=timeout, pg_timeout_s=pg_timeout_s)  # torchrun's world; world_size is not used
        if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun's agent is the parent
            _die_with_parent(os.getppid())
        heartbeat = Heartbeat(announce_failure, first_failure, lambda message: exit_now(message, write_error_file))
        try:
            init_distributed(get_accelerator(device), timeout_s=pg_timeout_s or timeout, heartbeat=heartbeat)
            if same is not None:
                check_same_on_every_rank(same)
            heartbeat.phase = "while running its work, after the process group was created"
            rank, world = dist.get_rank(), dist.get_world_size()
            value = fn(rank, world, *args)
        except Exception as exc:
            died = record_failure(exc, heartbeat)
            if died is not None:  # a transfer lost its peer: name the rank that died
                raise RankFailure(died[0], f"{died[1]}; global rank {heartbeat.rank} lost it: "
                                           f"{type(exc).__name__}: {exc}") from exc
            raise
        heartbeat.finish()
        dist.destroy_process_group()
        return [value if r == rank else None for r in range(world)]
    return run_distributed(fn, world_size, *args, timeout=timeout, threads=threads, pg_timeout_s=pg_timeout_s,
                           device=device)


__all__ = [
    "RankFailure", "announce_start_failure", "check_device_count", "check_launch", "check_same_on_every_rank",
    "init_distributed", "launch", "launched_by_torchrun", "preload", "rank_context", "run_distributed",
]
