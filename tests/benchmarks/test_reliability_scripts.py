"""Small-mode runs of benchmarks/soak.py (one Pipeline, good and bad requests, nothing lost) and
benchmarks/memory.py (the memory plan beside measured peaks)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)


@pytest.mark.slow
def test_soak_quick(tmp_path):
    out = tmp_path / "soak.md"
    proc = _run([os.path.join("benchmarks", "soak.py"), "--quick", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert "requests: 24 (20 good, bad: empty 1, too long 1, out of vocabulary 1, cancelled 1)" in text
    assert "tokens equal to a fresh run's: 20 / 20" in text and "Result: PASS" in text


@pytest.mark.slow
def test_memory_quick(tmp_path):
    proc = _run([os.path.join("benchmarks", "memory.py"), "--quick", "--out", str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = (tmp_path / "memory.md").read_text()
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| cpp |")]
    assert len(rows) == 2  # 1K tokens x 2 ranks (one pair of spawned ranks: a smoke run)
    for r in rows:
        assert float(r[9]) > 0 and float(r[11]) > 0  # plan and plan/peak figures present
