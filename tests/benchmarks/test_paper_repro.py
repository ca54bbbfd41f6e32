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
    assert set(blob["summary"]["counts"]) == {"fitted", "derived", "structural", "predicted"}
    assert blob["summary"]["counts"]["fitted"] == 3 and len(blob["fit"]) == 3
    assert all(c["status"] in ("fitted", "derived", "structural", "predicted") and "within" in c for c in blob["cells"])
    assert all(m["mechanism"] != "not analysed" for m in blob["misses"]), blob["misses"]
    status = {(c["section"], c["row"]): c["status"] for c in blob["cells"]}
    for key in (("Table 1", "CPP computation"), ("Table 1", "CPP exposed comm."), ("Table 2(c)", "DCPP Launch stall")):
        assert status[key] == "fitted", key
    for key in (("Table 2(a)", "VPP computation"), ("Table 2(b)", "DCPP Attention"), ("Table 2(b)", "VPP Attention")):
        assert status[key] == "derived", key           # restatements of the fitted CPP computation
    assert not any(c["row"].startswith("delta/") for c in blob["cells"])


@pytest.mark.slow
def test_what_if_rows_change_one_mechanism_each():
    from benchmarks import paper_whatif as PW
    from benchmarks.paper.sweep import fitted_setups
    setups, _ = fitted_setups()
    ds = setups["deepseek-v3.1"]
    rows = PW.variants(ds)
    assert rows[0][0].adopted and sum(v.adopted for v, *_ in rows) == 1
    assert all(v.source or v.adopted for v, *_ in rows)
    # the fixed cost per collective: what closes Table 1's DCPP-over-CPP communication, by its own arithmetic
    per_call = PW.collective_fixed_cost(ds)
    assert 1e-4 < per_call < 1e-2
    md = PW.section(setups)
    assert md.count("\n|") == len(rows) + 3 and "**(adopted)**" in md      # header, rule, rows, the paper
