"""`python -m benchmarks.cp_runs`: the small mode end to end (slow tier: it starts processes), and its
prediction against an independent sum of the cost model's chunk times (fast)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import cp_runs


def _calibration(tmp_path) -> str:
    """A calibration file with the cpu preset's constants (what `vpp calibrate` writes, untimed)."""
    from vpp.perf.hardware import CPU
    path = tmp_path / "cal_{model}.json"
    fields = {k: getattr(CPU, k) for k in ("peak_flops", "mem_bw", "link_bw", "eff_attn", "kernel_overhead")}
    for model in ("tiny-qwen", "tiny-deepseek"):
        (tmp_path / f"cal_{model}.json").write_text(json.dumps({"device": fields}))
    return str(path)


def test_pp1_prediction_is_the_sum_of_the_chunk_times_and_cp2_halves_the_attention(tmp_path):
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.perf.arch import Arch
    from vpp.perf.deployment import DeploymentCost
    from vpp.perf.hardware import get_device
    from vpp.perf.ops import Parallel
    from vpp.schedules import make_layout
    device = get_device("cpu", _calibration(tmp_path).format(model="tiny-qwen"))
    arch = Arch.from_config(TINY_CONFIGS["tiny-qwen"], name="tiny-qwen")
    cost = DeploymentCost(arch, device, make_layout("loop", arch.layers, 1), Parallel(act_bytes=4, weight_bytes=4,
                                                                                     kv_bytes=4))
    by_hand = sum(cost.compute(0, 1024, s) for s in range(0, 8192, 1024))
    assert cp_runs.predict("tiny-qwen", 8192, 1024, "pp1", device) == pytest.approx(by_hand)
    cp2 = cp_runs.predict("tiny-qwen", 8192, 1024, "cp2", device)
    assert by_hand / 2 < cp2 < by_hand  # half of every chunk's work, plus the ring and the merge


def test_from_json_rerenders_with_predictions(tmp_path):
    cell = {"model": "tiny-qwen", "length": 256, "chunk": 64, "cp2_methods": ["pass-kv"] * 4,
            "ttft_s": {c: {"median": 1.0, "min": 1.0, "max": 1.0, "values": [1.0]} for c in cp_runs.CONFIGS},
            "cpu_s": {c: {"median": 1.0, "min": 1.0, "max": 1.0, "values": [1.0]} for c in cp_runs.CONFIGS},
            "cp2_over_pp1": {"median": 1.0, "min": 1.0, "max": 1.0, "values": [1.0]},
            "pp2-vpp-async_over_pp1": {"median": 1.0, "min": 1.0, "max": 1.0, "values": [1.0]}}
    src = tmp_path / "in.json"
    src.write_text(json.dumps({"cells": [cell], "rounds": 1, "load": "quiet", "calibration": _calibration(tmp_path)}))
    assert cp_runs.main(["--from-json", str(src), "--out", str(tmp_path / "out")]) == 0
    again = json.loads((tmp_path / "out.json").read_text())["cells"][0]
    assert set(again["predicted_s"]) == set(cp_runs.CONFIGS)
    assert again["predicted_over_measured"]["pp1"] == pytest.approx(again["predicted_s"]["pp1"])
    assert "Predicted by the cost model" in (tmp_path / "out.md").read_text()


@pytest.mark.slow
def test_cp_runs_small(tmp_path):
    out = tmp_path / "cp_runs"
    subprocess.run([sys.executable, "-m", "benchmarks.cp_runs", "--models", "tiny-qwen", "--lengths", "64",
                    "--chunk-size", "16", "--rounds", "1", "--out", str(out), "--calibration", _calibration(tmp_path)],
                   check=True, timeout=900)
    cell = json.loads(out.with_suffix(".json").read_text())["cells"][0]
    assert set(cell["ttft_s"]) == {"pp1", "cp2", "pp2-vpp-async"}
    assert cell["cp2_over_pp1"]["median"] > 0 and cell["cp2_methods"] == ["pass-kv", "pass-kv", "pass-q", "pass-q"]
    assert "| tiny-qwen | 64 | 16 |" in out.with_suffix(".md").read_text()
