"""``benchmarks/device_check.py --dry-run``: the accelerator script's every step on CPU at tiny sizes
(bf16 families against transformers, a layer's tau_k law beside the cost model, the executor's device
path on two threads with loopback transfers, a 2-rank torchrun prefill with --check), so the script a
GPU/NPU machine runs is known to work before it gets there; run as that machine runs it
(``PYTHONPATH=.``, nothing installed), each part in its own process."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_device_check_dry_run(tmp_path):
    out = tmp_path / "device_check.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "device_check.py"), "--dry-run",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert "Kernels: attention `_cpu_split`, attention pieces `_cpu_lse`, experts `loop`" in text
    families = [line for line in text.splitlines() if line.startswith(("| qwen3_moe", "| deepseek", "| glm"))]
    assert len(families) == 8 and all(line.endswith("| yes |") for line in families)
    assert "| measured |" in text and "| cost model (cpu) |" in text
    runs = [line.split("|") for line in text.splitlines() if line.startswith(("| cpp ", "| vpp ", "| vpp-async "))]
    assert [r[1].strip() for r in runs] == ["cpp", "vpp", "vpp-async"]
    assert all(float(r[3]) < 1e-3 for r in runs)  # each schedule's logits equal the unpipelined forward
    loop = [line.split("|") for line in text.splitlines() if line.startswith(("| loopback cpp", "| loopback vpp"))]
    assert [r[1].strip() for r in loop] == ["loopback cpp", "loopback vpp-async"]
    assert all(float(r[7].split()[0]) == 0.0 for r in loop)  # the device path's logits = unpipelined forward
    parts = json.loads((tmp_path / "device_check.json").read_text())["parts"]
    assert all("error" not in p for p in parts.values())


@pytest.mark.slow
def test_a_failing_part_is_reported_and_the_others_still_run(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "device_check.py"), "--dry-run",
                           "--parts", "a,b", "--out", str(tmp_path)], capture_output=True, text=True, timeout=400,
                          cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, VPP_DEVICE_CHECK_FAIL="a"))
    assert proc.returncode == 1
    text = (tmp_path / "device_check.md").read_text()
    assert "part (a) FAILED" in text and "failed on purpose" in text
    assert "| measured |" in text  # part (b) ran
