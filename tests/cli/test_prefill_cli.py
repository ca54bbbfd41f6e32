"""``vpp prefill`` end to end on spawned CPU ranks (toy model: fast), and its --check verdict."""

import pytest
import json
import subprocess
import sys

import torch
from safetensors.torch import load_file

from vpp.cli.prefill import report
from vpp.models.toy import ToyStage
from vpp.bench.prefill import BenchConfig, Row


@pytest.mark.slow
def test_prefill_command_runs_every_schedule_and_checks_logits(tmp_path):
    logits_file, trace_dir = tmp_path / "logits.safetensors", tmp_path / "trace"
    proc = subprocess.run(
        [sys.executable, "-m", "vpp", "prefill", "--model", "toy", "--pp", "2", "--seq-len", "300",
         "--chunk-size", "64", "--repeat", "2", "--check", "--json", "--no-progress",
         "--save-logits", str(logits_file), "--trace", str(trace_dir)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert [r["schedule"] for r in out["rows"]] == ["cpp", "vpp", "vpp-async"]
    for row in out["rows"]:
        assert len(row["ttft"]["values"]) == 2 and row["ttft"]["median"] > 0
        assert 0 <= row["bubble_ratio"]["median"] < 1
        assert row["max_abs_diff"] < 1e-4
    assert out["rows"][0]["speedup"]["values"] == [1.0, 1.0]
    # the saved logits are the toy model's, computed here independently
    saved = load_file(str(logits_file))
    ref = ToyStage((0, 8), 8, hidden_size=64, vocab_size=512)(saved["input_ids"], 0, 0, last_token_only=True)[-1]
    for schedule in ("cpp", "vpp", "vpp-async"):
        torch.testing.assert_close(saved[f"logits.{schedule}"], ref, atol=1e-4, rtol=1e-4)
    written = {p.name for p in trace_dir.iterdir()}
    assert {"vpp.trace.json", "vpp.chrome.json", "vpp.png", "cpp.simulated.png"} <= written


def test_check_failure_is_loud(capsys):
    cfg = BenchConfig(model="toy", check=True)
    rows = [Row("cpp", ttft=[1.0], max_abs_diff=0.5), Row("vpp", ttft=[1.0], max_abs_diff=1e-7)]
    facts = {"transfer_s": 0.0, "layouts": {}, "check": {"cpp": 0.5, "vpp": 1e-7}}
    assert report(rows, facts, cfg, as_json=False, atol=1e-3) == 1
    assert "CHECK FAILED: logits of ['cpp'] differ" in capsys.readouterr().err
    rows[0].max_abs_diff = 1e-6
    assert report(rows, facts, cfg, as_json=False, atol=1e-3) == 0
