"""The committed results of the fast deterministic benchmarks are what the code gives now.

A results file is a promise (README): when the model changes and a report is not regenerated, its
figures go stale silently (tail_merge.md and stream_sim.md once quoted a DCPP planner two versions
old). Each script here runs in a few seconds, deterministically; its markdown must equal the committed
one but for the line that says how long it took. The slower reports are held otherwise:
paper_repro.json by ``tests/benchmarks/test_paper_repro.py`` (its quick run gives the same fit and cells),
beyond_paper.md's Findings by ``tests/benchmarks/test_beyond_paper.py`` (written from its JSON),
checkpoint_reads by its own byte counts (below)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks.paper import published as paper

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FRESH = {  # script -> (its arguments writing into DIR, the markdown it writes there)
    "cp_compare": (["--out", "{dir}"], "cp_compare.md"),
    "tail_merge": (["--out", "{dir}"], "tail_merge.md"),
    "stream_sim": (["--out", "{dir}/stream_sim.md"], "stream_sim.md"),
    "device_emulation": (["--json", "--out", "{dir}"], "device_emulation.md"),   # virtual time: exact
}


def _body(text: str) -> list[str]:
    return [line for line in text.rstrip().splitlines() if not line.startswith("_Generated in")]


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(FRESH))
def test_a_committed_report_is_what_its_script_gives_now(script, tmp_path):
    args, name = FRESH[script]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{script}", *[a.format(dir=tmp_path) for a in args]],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    now, committed = _body((tmp_path / name).read_text()), _body((RESULTS / name).read_text())
    stale = [f"line {i + 1}: committed {c!r}, now {n!r}" for i, (c, n) in enumerate(zip(committed, now)) if c != n]
    assert len(now) == len(committed) and not stale, (
        f"benchmarks/results/{name} is stale: run `python -m benchmarks.{script}` and commit it "
        f"({len(committed)} vs {len(now)} lines; first differences: {stale[:3]})")


def test_the_results_readme_quotes_the_committed_paper_scores():
    """benchmarks/results/README.md's figures for the paper model are the committed JSONs' (a hand-written
    summary goes stale when the reports are regenerated; the JSONs are held to the code above and in
    test_scripts.py)."""
    text = " ".join((RESULTS / "README.md").read_text().split())
    repro = json.loads((RESULTS / "paper_repro.json").read_text())
    s = repro["summary"]
    assert f"**{s['predicted_within']} of {s['predicted_scored']} predicted cells are within tolerance**" in text
    assert f"**{s['predicted_within']} of {s['predicted_scored']} predicted cells within tolerance" in \
        (RESULTS / "paper_repro.md").read_text()
    totals = {k: v["total"] for k, v in repro["table_512k"].items()}
    errors = [totals[s] / paper.TABLE_512K[p]["total"] - 1 for s, p in (("cpp", "cpp"), ("dcpp", "dcpp"), ("vpp-async", "vpp"))]
    assert f"totals are within {math.ceil(100 * max(abs(e) for e in errors))}%" in text
    assert totals["vpp-async"] < totals["cpp"] < totals["dcpp"]


@pytest.mark.slow
def test_checkpoint_reads_reproduce_the_committed_bytes(tmp_path):
    """Byte counts are deterministic: one model's rows equal the committed results' (what
    ``benchmarks/results/checkpoint_reads.md`` states), with the committed "before" column."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.checkpoint_reads", "--models", "tiny-deepseek",
                           "--json", str(tmp_path / "rows.json"), "--before", str(RESULTS / "checkpoint_reads_before.json"),
                           "--out", str(tmp_path / "reads.md")], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    committed = [r for r in json.loads((RESULTS / "checkpoint_reads.json").read_text()) if r["model"] == "tiny-deepseek"]
    assert len(rows) == 10 and rows == committed
    assert sum(line.startswith("| tiny-deepseek") for line in (tmp_path / "reads.md").read_text().splitlines()) == 10
