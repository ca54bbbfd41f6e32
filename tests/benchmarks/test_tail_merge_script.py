"""``benchmarks/tail_merge.py --quick``: the tail-merging table's every step at one model, two lengths
and one budget, checked against what the planners give for those cells."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_tail_merge_quick_run():
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "tail_merge.py"), "--quick", "--out", ""],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "of 6 cells have a final chunk below budget // 4" in proc.stdout and "## Threshold: 512" in proc.stdout
    # CPP at 64K / 24K leaves a 16K tail (not below 6K): never merged
    assert "| deepseek-v3.1 | cpp |" not in proc.stdout
