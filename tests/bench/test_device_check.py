"""``benchmarks/device_check.py --dry-run``: the accelerator script's every step on CPU at tiny sizes
(bf16 families against transformers, a layer's tau_k law beside the cost model, a 2-rank torchrun
prefill with --check), so the script a GPU/NPU machine runs is known to work before it gets there."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_device_check_dry_run(tmp_path):
    out = tmp_path / "device_check.md"
    # as a module from the root, as benchmarks/ is run: this checkout's vpp and benchmarks come first
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.device_check", "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert "Kernels: attention `_cpu_split`, attention pieces `_cpu_lse`, experts `loop`" in text
    families = [line for line in text.splitlines() if line.startswith(("| qwen3_moe", "| deepseek", "| glm"))]
    assert len(families) == 8 and all(line.endswith("| yes |") for line in families)
    assert "| measured |" in text and "| cost model (cpu) |" in text
    runs = [line.split("|") for line in text.splitlines() if line.startswith(("| cpp ", "| vpp ", "| vpp-async "))]
    assert [r[1].strip() for r in runs] == ["cpp", "vpp", "vpp-async"]
    assert all(float(r[3]) < 1e-3 for r in runs)  # each schedule's logits equal the unpipelined forward
