"""A CPU rank keeps the host memory it frees (vpp.parallel.host_memory): glibc's thresholds fixed, so
blocks of a few tens of MB are reused instead of being unmapped and page-faulted again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from vpp.parallel import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# 40 MiB blocks: above glibc's largest dynamic mmap threshold (32 MiB), so by default every one is a
# fresh mapping whose pages fault in on every round; below vpp's 64 MiB threshold, so kept, they come
# from the heap and are reused
FAULTS = textwrap.dedent("""
    import resource, sys, torch
    from vpp.parallel.host_memory import keep_freed_host_memory
    print(keep_freed_host_memory())
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    def once():
        blocks = [torch.ones(40 << 18) for _ in range(2)]
        del blocks
    once(); once()
    rounds = []
    for _ in range(7):
        before = faults()
        once()
        rounds.append(faults() - before)
    print(sorted(rounds)[3])  # the median round: a heap still growing may fault once
""")


def _faults(setting: str) -> tuple[str, float]:
    env = {**os.environ, host_memory.ENV: setting, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    said, faults = out.stdout.split()
    return said, float(faults)


@pytest.mark.slow  # starts two interpreters
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_blocks_are_reused_without_page_faults():
    said, kept = _faults("keep")
    assert said == "kept"
    default, faulted = _faults("default")
    assert default == "default"
    pages = (40 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert faulted >= pages, faulted  # by default both blocks are mapped afresh every round (the case is real)
    assert kept < pages / 20, (kept, faulted)


def test_a_bad_setting_is_one_line(monkeypatch):
    monkeypatch.setenv(host_memory.ENV, "sometimes")
    with pytest.raises(ValueError, match="VPP_HOST_MALLOC='sometimes' is not one of"):
        host_memory.mode()


def _rank_setting(rank, world):
    return host_memory.keep_freed_host_memory()


@pytest.mark.slow
def test_every_cpu_rank_keeps_its_memory(worlds):
    assert worlds.run(2, _rank_setting) == ["kept", "kept"]
