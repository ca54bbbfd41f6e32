"""`python -m benchmarks.paper_repro --quick` runs end to end (slow tier: it starts a process) and writes
a report whose every cell carries a status and a verdict."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_quick_mode_writes_the_report(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.paper_repro", "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "paper_repro.md").exists()
    blob = json.loads((tmp_path / "paper_repro.json").read_text())
    assert blob["cells"] and blob["summary"]["cells"] == len(blob["cells"])
