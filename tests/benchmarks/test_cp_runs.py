"""`python -m benchmarks.cp_runs` in a small mode (slow tier: it starts processes): one round of PP1, CP2
and PP2 VPP-Async on a short prompt, the results files written with every ratio."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_cp_runs_small(tmp_path):
    out = tmp_path / "cp_runs"
    subprocess.run([sys.executable, "-m", "benchmarks.cp_runs", "--models", "tiny-qwen", "--lengths", "64",
                    "--chunk-size", "16", "--rounds", "1", "--out", str(out)], check=True, timeout=900)
    cell = json.loads(out.with_suffix(".json").read_text())["cells"][0]
    assert set(cell["ttft_s"]) == {"pp1", "cp2", "pp2-vpp-async"}
    assert cell["cp2_over_pp1"]["median"] > 0 and cell["cp2_methods"] == ["pass-kv", "pass-kv", "pass-q", "pass-q"]
    assert "| tiny-qwen | 64 | 16 |" in out.with_suffix(".md").read_text()
