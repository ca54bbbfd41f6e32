"""benchmarks.attention_kernel: its arguments, and a tiny run through its real path (both kernels,
one process) whose two outputs agree."""

import pytest

from benchmarks import attention_kernel
from vpp.transformer.attention import cpu_kernel


@pytest.mark.parametrize("argv", [["--heads", "8,3"], ["--heads", "8"], ["--width", "64"], ["--reps", "0"],
                                  ["--prefixes", "1k"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        attention_kernel.parse_args(argv)
    assert exc.value.code == 2
    assert "attention_kernel" in capsys.readouterr().err


@pytest.mark.skipif(cpu_kernel.library() is None, reason="vpp's CPU attention kernel does not run here")
def test_a_tiny_run_compares_both_kernels(tmp_path):
    args = attention_kernel.parse_args(["--prefixes", "0,100", "--chunk", "48", "--heads", "4,2", "--reps", "2",
                                        "--out", str(tmp_path / "r")])
    rows = attention_kernel.measure(args)
    assert [r["prefix"] for r in rows] == [0, 100]
    assert all(r["diff"] <= 1e-5 and r["vpp"][0] > 0 and r["torch"][0] > 0 for r in rows)
    text = attention_kernel.render(rows, args)
    assert "--prefixes 0,100 --chunk 48 --heads 4,2" in text
    assert [line.split(" | ")[0] for line in text.splitlines() if line[:3] in ("| 0", "| 1")] == ["| 0", "| 100"]
