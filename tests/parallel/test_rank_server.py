"""The rank server's pure parts (vpp.parallel.spawn): whether a process runs, which start method ranks
get, what the server preloads, and a rank whose launcher is already gone ending at once. In-process:
the spawned paths are exercised by every slow test that starts ranks."""

from __future__ import annotations

import os

import pytest

from vpp.parallel import spawn


def _dead_pid() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1  # no process can have it


def test_alive_says_which_processes_run(monkeypatch):
    assert spawn._alive(os.getpid())
    assert not spawn._alive(_dead_pid())

    def denied(pid, sig):
        raise PermissionError(1, "not yours")
    monkeypatch.setattr(spawn.os, "kill", denied)
    assert spawn._alive(12345)  # exists, owned by someone else


def test_alive_without_proc_trusts_kill(monkeypatch):
    def no_proc(*_a, **_k):
        raise OSError("no /proc here")
    monkeypatch.setattr(spawn, "open", no_proc, raising=False)
    assert spawn._alive(os.getpid())


def test_ranks_fork_from_the_server_where_there_is_one_else_spawn(monkeypatch):
    assert spawn.rank_context().get_start_method() == "forkserver"  # Linux
    monkeypatch.setattr(spawn.mp, "get_all_start_methods", lambda: ["spawn"])
    assert spawn.rank_context().get_start_method() == "spawn"


def test_preload_adds_each_module_once(monkeypatch):
    monkeypatch.setattr(spawn, "_preload", list(spawn.PRELOAD))
    spawn.preload("json", "torch", "json")
    assert spawn._preload == [*spawn.PRELOAD, "json"]
    assert "torch" in spawn.PRELOAD and "vpp.models" in spawn.PRELOAD


def test_a_rank_whose_launcher_is_gone_ends_at_once(monkeypatch):
    class Exited(Exception):
        pass

    def exit_now(code):
        raise Exited(code)

    def no_libc(*_a, **_k):  # and never set the parent-death signal on the test process itself
        raise OSError("no libc")
    monkeypatch.setattr(spawn.ctypes, "CDLL", no_libc)
    monkeypatch.setattr(spawn.os, "_exit", exit_now)
    with pytest.raises(Exited):
        spawn._die_with_parent(_dead_pid())
