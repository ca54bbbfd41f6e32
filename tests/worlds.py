"""Persistent gloo worlds for the slow tier: ranks spawned once per world size and reused by many cases.

Ranks are forks of vpp's rank server (:func:`vpp.parallel.spawn.rank_context`, which has torch and vpp
imported), so starting one is cheap; what a world saves is the rendezvous and the process group, and a
case's imports, per call of ``run_distributed``. A :class:`World` pays them once: its ranks initialise the
default process group, then serve cases, ``fn(rank, world_size, *args)`` like ``run_distributed``'s,
until the session ends. The ``worlds`` fixture (tests/conftest.py) hands out one world per size.

Each case starts as a fresh process would see it: torch's default seed and Python's ``random`` reset,
one intra-op thread, and the process groups the previous case created (``initialize_model_parallel``)
destroyed after it, so no case depends on which ran before.

Failures: a case that raises on some ranks fails with their tracebacks once every rank answered; a rank
that does not answer within ``timeout`` (or within a grace after a peer raised: it waits for a peer
that stopped), or dies, fails the case naming it, and the world is stopped and spawned anew for the
next case. Cases that plant faults (kill a rank, leave transfers behind, monkeypatch a module without
restoring it in a ``finally``) keep their own ``run_distributed`` worlds.

No process stays behind: :meth:`Worlds.close` ends every rank at session end (teardown also runs on
Ctrl-C), and each rank dies with the pytest process (SIGKILL included: ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import random
import signal
import tempfile
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist

from vpp.parallel.device import get_accelerator
from vpp.parallel.rendezvous import init_distributed
from vpp.parallel.spawn import RankFailure, _die_with_parent, rank_context

LIVE: set[int] = set()  # pids of world ranks: tests/conftest.py does not count them as left behind
GRACE_S = 30.0  # after a rank raised, how long its peers have to answer (vpp's own waits stop them first)
_SEED = 67280421310721  # torch's default seed in a fresh process (torch.initial_seed())


def _serve(rank: int, size: int, init_file: str, tasks, results, parent_pid: int, pg_timeout_s: float,
           environ: dict[str, str]) -> None:
    _die_with_parent(parent_pid)
    os.environ.clear()  # the suite's environment when the world started, not the rank server's
    os.environ.update(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the parent stops us
    torch.set_num_threads(1)
    try:
        init_distributed(get_accelerator("cpu"), init_method=f"file://{init_file}", rank=rank, world_size=size,
                         local_rank=rank, timeout_s=pg_timeout_s)
    except BaseException as exc:  # noqa: BLE001
        results.put((rank, 0, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        return
    results.put((rank, 0, True, None))
    while True:
        task = tasks.get()
        if task is None:
            break
        seq, fn, args = task
        torch.manual_seed(_SEED)
        random.seed(0)
        torch.set_num_threads(1)
        try:
            results.put((rank, seq, True, pickle.dumps(fn(rank, size, *args))))
        except BaseException as exc:  # noqa: BLE001 -- report everything to the parent
            results.put((rank, seq, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        _drop_subgroups()
    dist.destroy_process_group()


def _drop_subgroups() -> None:
    """Destroy every process group but the default one (a case's TP/PP/EP groups): each holds sockets."""
    world = dist.distributed_c10d._world
    for pg in list(world.pg_map):
        if pg is not dist.GroupMember.WORLD:
            try:
                dist.destroy_process_group(pg)
            except Exception:  # noqa: BLE001 -- already gone
                pass


class World:
    """``size`` spawned gloo ranks serving cases; see the module docstring."""

    def __init__(self, size: int, startup_timeout: float = 300.0, pg_timeout_s: float = 600.0):
        self.size, self.startup_timeout, self.pg_timeout_s = size, startup_timeout, pg_timeout_s
        self.procs: list = []
        self.seq = 0
        self.spawns = 0  # how many times this world's ranks were started (1 unless a case broke it)

    def _start(self) -> None:
        ctx = rank_context()  # forked from the rank server (vpp.parallel.spawn): no interpreter start-up
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(self.size)]
        self.tmp = tempfile.TemporaryDirectory(prefix="vpp-world-")
        init_file = os.path.join(self.tmp.name, "rendezvous")
        self.procs = [ctx.Process(target=_serve, daemon=True,
                                  args=(r, self.size, init_file, self.tasks[r], self.results, os.getpid(),
                                        self.pg_timeout_s, dict(os.environ)))
                      for r in range(self.size)]
        for p in self.procs:
            p.start()
            LIVE.add(p.pid)
        self.spawns += 1
        self._collect(0, self.startup_timeout, what="start-up")

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 300.0) -> list[Any]:
        """``fn(rank, size, *args)`` on every rank; the per-rank return values in rank order."""
        if not self.procs:
            self._start()
        self.seq += 1
        for q in self.tasks:
            q.put((self.seq, fn, args))
        try:
            return self._collect(self.seq, timeout, what=getattr(fn, "__qualname__", repr(fn)))
        except RankFailure:
            raise
        except BaseException:  # interrupted (Ctrl-C, pytest-timeout) while the ranks run the case: stop them
            self.close()
            raise

    def _collect(self, seq: int, timeout: float, what: str) -> list[Any]:
        deadline = time.monotonic() + timeout
        values: dict[int, Any] = {}
        errors: dict[int, str] = {}
        while len(values) + len(errors) < self.size:
            try:
                rank, got_seq, ok, payload = self.results.get(timeout=0.1)
            except queue.Empty:
                dead = [r for r, p in enumerate(self.procs) if r not in values and r not in errors and not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    missing = sorted(set(range(self.size)) - set(values) - set(errors))
                    why = (f"rank {dead[0]} died (exit code {self.procs[dead[0]].exitcode})" if dead else
                           f"ranks {missing} did not answer within {timeout:.0f}s")
                    self.close()  # the world is in an unknown state: the next case gets a fresh one
                    first_error = next(iter(errors.values()), "")
                    raise RankFailure(dead[0] if dead else missing[0],
                                      f"{what} on a world of {self.size}: {why}\n{first_error}")
                continue
            if got_seq != seq:  # a late answer of a case that already failed
                continue
            if ok:
                values[rank] = pickle.loads(payload) if payload is not None else None
            else:
                errors[rank] = payload
                deadline = min(deadline, time.monotonic() + GRACE_S)
        if errors:
            if seq == 0:
                self.close()
            first = min(errors)
            others = "".join(f"\n--- rank {r} ---\n{m}" for r, m in sorted(errors.items()) if r != first)
            raise RankFailure(first, f"{what}: rank {first} of {self.size} failed:\n{errors[first]}{others}")
        return [values[r] for r in range(self.size)]

    def close(self) -> None:
        """Stop every rank (a polite stop first, then SIGTERM, then SIGKILL) and forget them."""
        procs, self.procs = self.procs, []
        for p, q in zip(procs, getattr(self, "tasks", [])):
            if p.is_alive():
                try:
                    q.put(None)
                except Exception:  # noqa: BLE001
                    pass
        deadline = time.monotonic() + 5
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(3)
            if p.is_alive():
                p.kill()
                p.join(2)
            LIVE.discard(p.pid)
        if procs:
            self.tmp.cleanup()


class Worlds:
    """One :class:`World` per size, started on first use; at most ``max_ranks`` ranks alive at once
    (the least recently used worlds are stopped to make room)."""

    def __init__(self, max_ranks: int = 10):
        self.max_ranks = max_ranks
        self.by_size: dict[int, World] = {}
        self.order: list[int] = []  # sizes, least recently used first
        atexit.register(self.close)

    def get(self, size: int) -> World:
        world = self.by_size.setdefault(size, World(size))
        if size in self.order:
            self.order.remove(size)
        self.order.append(size)
        alive = lambda: sum(w.size for w in self.by_size.values() if w.procs)  # noqa: E731
        for other in list(self.order[:-1]):
            if not world.procs and alive() + size > self.max_ranks and self.by_size[other].procs:
                self.by_size[other].close()
        return world

    def run(self, size: int, fn: Callable[..., Any], *args: Any, timeout: float = 300.0) -> list[Any]:
        return self.get(size).run(fn, *args, timeout=timeout)

    def close(self) -> None:
        for world in self.by_size.values():
            world.close()
