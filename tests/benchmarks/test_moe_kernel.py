"""benchmarks.moe_kernel: its arguments, and a tiny run through its real path (the fused kernel and the
reference, one process) whose outputs agree."""

import pytest

from benchmarks import moe_kernel
from vpp.transformer import cpu_ops


@pytest.mark.parametrize("argv", [["--tokens", "0"], ["--top-k", "9"], ["--rounds", "0"], ["--inter", "x"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        moe_kernel.parse_args(argv)
    assert exc.value.code == 2
    assert "moe_kernel" in capsys.readouterr().err


@pytest.mark.skipif(cpu_ops.library() is None, reason="vpp's CPU MoE kernel does not run here")
def test_a_tiny_run_compares_the_kernel_with_the_reference(tmp_path, capsys):
    assert moe_kernel.main(["--tokens", "70", "--hidden", "48", "--inter", "40", "--experts", "3", "--rounds", "2",
                            "--calls", "1", "--out", str(tmp_path / "r")]) == 0
    text = (tmp_path / "r.md").read_text()
    diff = float(text.split("max |vpp - reference| = ")[1].split(".\n")[0].rstrip("."))
    assert diff <= 1e-5
    rows = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["| path", "| reference", "| vpp"]
