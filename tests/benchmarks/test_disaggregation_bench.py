"""The smoke runs of ``benchmarks/disaggregation.py --quick`` and ``benchmarks/decode_speed.py --quick``:
every step of the scripts at tiny sizes. Asserts the facts they report (bytes handed over equal the
decode caches, the same tokens decoded on both layouts and by transformers), never a time."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(script, out):
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out.read_text()


@pytest.mark.slow
def test_disaggregation_quick(tmp_path):
    text = _run("disaggregation.py", tmp_path / "d.md")
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| tiny-deepseek")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0]]
    prefill_mb, decode_mb, sent_mb = float(cells[3]), float(cells[4]), float(cells[5])
    assert sent_mb == decode_mb  # every byte sent once: what the decode ranks hold
    assert decode_mb == pytest.approx(2 * prefill_mb, abs=0.15)  # MLA's latent replicated on both TP ranks
    assert cells[-1] == "yes"  # the same tokens decoded in the V and on the TP group
    assert "| deepseek-v3.1 | 128K |" in text


@pytest.mark.slow
def test_decode_speed_quick(tmp_path):
    text = _run("decode_speed.py", tmp_path / "s.md")
    rows = [line for line in text.splitlines() if line.startswith(("| qwen3_moe", "| deepseek", "| glm"))]
    assert len(rows) == 4 and all(r.endswith("| yes |") for r in rows)  # vpp's greedy tokens = transformers'
