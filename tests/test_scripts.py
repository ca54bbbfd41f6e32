"""Every script in ``benchmarks/`` and ``examples/`` runs in the suite, in a small mode, so none can rot
unnoticed (``benchmarks/results/`` and the README name them).

Each benchmark runs as the README says to run it, ``python -m benchmarks.NAME`` from the repository root,
with the smallest arguments that still take its real path (spawned ranks where it spawns them, every
section, every file it writes), and writes into the test's temporary directory, never into
``benchmarks/results/``. The examples run in ``tests/cli/test_examples.py`` and the accelerator script's
dry run in ``tests/benchmarks/test_device_check.py``; :func:`test_every_script_has_a_run` keeps the list whole.
Small sizes: these check that a script runs and writes what it says, not its figures.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# scripts whose small-mode run another branch is adding; the test below fails once one is covered
PENDING: dict[str, str] = {}  # scripts whose small-mode run another branch is adding (none now)


def _run(*args, timeout=600) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def _scripts() -> list[str]:
    """Every runnable file in benchmarks/ and examples/ (one with a ``__main__`` block)."""
    return sorted(str(p.relative_to(ROOT)) for top in ("benchmarks", "examples") for p in (ROOT / top).glob("*.py")
                  if 'if __name__ == "__main__"' in p.read_text())


def _rows(markdown: str, first_cell: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("|")[1:-1]] for line in markdown.splitlines()
            if line.startswith(f"| {first_cell}")]


# --- simulated (no processes but the script's own) ----------------------------------------------------

@pytest.mark.slow
def test_paper_sensitivity_quick(tmp_path):
    """The adopted row, computed by the sensitivity script's own path (refit, rerun, score), must give
    the committed paper_repro.json's fit and its predicted cells within (names and count); the variant must refit (a GEMM
    efficiency halved moves the attention efficiency the fit finds) and keep the same cells scored."""
    committed = ROOT / "benchmarks" / "results" / "paper_repro.json"
    _run("-m", "benchmarks.paper_sensitivity", "--quick", "--statuses", str(committed), "--out", str(tmp_path))
    rows = json.loads((tmp_path / "paper_sensitivity.json").read_text())["rows"]
    summary = json.loads(committed.read_text())["summary"]
    adopted, half = rows
    assert adopted["variant"] == "adopted" and half["changes"] == {"eff_matmul": 0.35}
    # the committed report is what the code gives now: the same fit, the same predicted cells within
    committed_within = sorted(f"{c['section']}: {c['row']}" for c in json.loads(committed.read_text())["cells"]
                              if c["status"] == "predicted" and c["within"])
    assert adopted["within"] == committed_within, "benchmarks/results/paper_repro.* is stale: rerun paper_repro"
    fit = json.loads(committed.read_text())["fit"]
    assert all(abs(adopted["fit"][k] - fit[k]) <= 1e-9 * abs(fit[k]) for k in fit), (adopted["fit"], fit)
    assert len(adopted["within"]) == summary["predicted_within"]
    assert adopted["scored"] == half["scored"] == summary["predicted_scored"]
    assert abs(half["fit"]["eff_attn"] - adopted["fit"]["eff_attn"]) > 1e-3
    md = (tmp_path / "paper_sensitivity.md").read_text()
    assert f"{summary['predicted_within']} of {summary['predicted_scored']}" in md


@pytest.mark.slow
def test_beyond_paper_quick(tmp_path):
    _run("-m", "benchmarks.beyond_paper", "--quick", "--out", str(tmp_path))
    md = (tmp_path / "beyond_paper.md").read_text()
    assert [line[:5] for line in md.splitlines() if line.startswith("## ") and line[3].isdigit()] == \
        ["## 1.", "## 2.", "## 3.", "## 4.", "## 5."]
    assert set(json.loads((tmp_path / "beyond_paper.json").read_text())) == {"pp", "dsa", "memory", "tune", "devices"}
    assert (tmp_path / "pp_depth_512k.png").stat().st_size > 0 and (tmp_path / "dsa_tau_k.png").stat().st_size > 0


@pytest.mark.slow
def test_cp_compare(tmp_path):
    _run("-m", "benchmarks.cp_compare", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "cp_compare.json").read_text())["rows"]
    assert rows[0]["name"] == "llama3-405b-1m-128xh100" and rows[0]["ttft_s"] > 0
    assert "## 2. 16 devices" in (tmp_path / "cp_compare.md").read_text()


@pytest.mark.slow
def test_stream_sim(tmp_path):
    out = tmp_path / "stream_sim.md"
    _run("-m", "benchmarks.stream_sim", "--scale", "256", "--requests", "2", "--out", str(out))
    md = out.read_text()
    assert "**Packing removes" in md and "## The ablation stream on deeper pipelines" in md
    assert md.count("## Short: 100 concurrent requests") == 3 and "## Mixed" in md


# --- measured on spawned ranks -------------------------------------------------------------------------

@pytest.mark.slow
def test_checkpoint_reads_reproduce_the_committed_bytes(tmp_path):
    """Byte counts are deterministic: one model's rows equal the committed results' (what
    ``benchmarks/results/checkpoint_reads.md`` states), with the committed "before" column."""
    before = ROOT / "benchmarks" / "results" / "checkpoint_reads_before.json"
    _run("-m", "benchmarks.checkpoint_reads", "--models", "tiny-deepseek", "--json", str(tmp_path / "rows.json"),
         "--before", str(before), "--out", str(tmp_path / "reads.md"))
    rows = json.loads((tmp_path / "rows.json").read_text())
    committed = [r for r in json.loads((ROOT / "benchmarks" / "results" / "checkpoint_reads.json").read_text())
                 if r["model"] == "tiny-deepseek"]
    assert len(rows) == 10 and rows == committed
    assert len(_rows((tmp_path / "reads.md").read_text(), "tiny-deepseek")) == 10


@pytest.mark.slow
def test_inference_loop_quick(tmp_path):
    out = tmp_path / "inference_loop.md"
    _run("-m", "benchmarks.inference_loop", "--quick", "--rounds", "1", "--out", str(out))
    md = out.read_text()
    assert len(_rows(md, "tiny-deepseek")) == 2  # PP 1 and PP 2
    assert "| `Pipeline.prefill`" in md


@pytest.mark.slow
def test_measured_quick(tmp_path):
    _run("-m", "benchmarks.measured", "--quick", "--out", str(tmp_path))
    record = json.loads((tmp_path / "measured.json").read_text())
    assert list(record) == ["prefill", "stream-long", "stream-long-3", "stream-mixed"]
    assert all(r["table"].strip() for r in record.values())
    md = (tmp_path / "measured.md").read_text()
    assert all(f"## {job}" in md for job in record)


@pytest.mark.slow
def test_memory(tmp_path):
    _run("-m", "benchmarks.memory", "--lengths", "512", "--chunk", "128", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "memory.json").read_text())["rows"]
    assert sorted((r["schedule"], r["rank"]) for r in rows) == [("cpp", 0), ("cpp", 1), ("vpp-async", 0), ("vpp-async", 1)]
    assert all(r["weights"] > 0 and r["kv"] > 0 for r in rows)
    assert "| schedule | tokens |" in (tmp_path / "memory.md").read_text()


@pytest.mark.slow
def test_moe_dispatch(tmp_path):
    out = tmp_path / "moe_dispatch.md"
    _run("-m", "benchmarks.moe_dispatch", "--tokens", "64", "--shapes", "comm", "--rounds", "1", "--out", str(out))
    assert len(_rows(out.read_text(), "comm")) == 1


@pytest.mark.slow
def test_partition_balance(tmp_path):
    _run("-m", "benchmarks.partition_balance", "--seq-len", "1024", "--chunk", "256", "--rounds", "1",
         "--out", str(tmp_path))
    md = (tmp_path / "partition_balance.md").read_text()
    assert len(_rows(md, "even")) == 1 and len(_rows(md, "rank")) == 1 and "Rank contents" in md
    assert set(json.loads((tmp_path / "partition_balance.json").read_text())["ttft"]) == \
        {"even/cpp", "even/vpp-async", "rank/cpp", "rank/vpp-async"}


@pytest.mark.slow
def test_tiny_chunk_latency():
    out = _run("-m", "benchmarks.tiny_chunk_latency", "--tokens", "512", "--chunk", "256", "--runs", "1",
               "--models", "tiny-deepseek", "--two-ranks")
    assert re.search(r"^tiny-deepseek\s+\d+ \[", out, re.M), out


@pytest.mark.slow
def test_cpu_regression_quick(tmp_path):
    _run("-m", "benchmarks.cpu_regression", "--quick", "--model-dir", str(tmp_path / "model"), "--out", str(tmp_path))
    res = json.loads((tmp_path / "cpu_regression.json").read_text())
    assert [r["schedule"] for r in res["rows"]] == ["cpp", "vpp-async"] and len(res["rounds"]) == 1
    assert all(r["after_over_before"]["median"] > 0 and r["pp2_over_pp1"]["median"] > 0 for r in res["rows"])
    md = (tmp_path / "cpu_regression.md").read_text()
    assert len(_rows(md, "cpp")) == 1 and len(_rows(md, "vpp-async")) == 1 and "Command:" in md


# --- the list is whole -------------------------------------------------------------------------------

def test_every_script_has_a_run():
    """Every runnable script is run by some test (named as ``benchmarks.NAME``, ``benchmarks/NAME.py`` or
    ``NAME.py`` in a test file under tests/), except the pending ones, which are not yet."""
    text = "\n".join(p.read_text() for p in TESTS.rglob("*.py") if p.name != "test_references.py")
    covered, missing = set(), []
    for script in _scripts():
        stem = pathlib.Path(script).stem
        if re.search(rf"benchmarks\.{stem}\b|benchmarks/{stem}\.py|[\"']{stem}\.py[\"']|examples/{stem}\.py", text):
            covered.add(stem)
        elif stem not in PENDING:
            missing.append(script)
    assert not missing, f"scripts no test runs: {missing} (add a small-mode run to tests/test_scripts.py)"
    assert not covered & set(PENDING), f"now covered, remove from PENDING: {sorted(covered & set(PENDING))}"


@pytest.mark.slow
def test_a_benchmark_runs_as_a_file_from_anywhere(tmp_path):
    """``python benchmarks/NAME.py`` works as well as ``-m``: an editable install of this checkout
    (``pip install -e .``, what the README's test command does) provides the ``benchmarks`` package, so a
    script run by its path, from another directory and with no PYTHONPATH, finds its siblings. Without
    that install (e.g. the suite run on PYTHONPATH alone) there is nothing to check."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([sys.executable, "-c", "import benchmarks, os; print(os.path.dirname(benchmarks.__file__))"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    if where.returncode != 0 or pathlib.Path(where.stdout.strip()).resolve() != ROOT / "benchmarks":
        pytest.skip(f"benchmarks is not installed from {ROOT} (pip install -e .): {where.stdout.strip() or where.stderr[-200:]}")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "paper_repro.py"), "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "paper_repro.json").read_text())["summary"]["cells"] > 0
