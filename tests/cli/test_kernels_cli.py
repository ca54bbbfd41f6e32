"""``vpp kernels``: one line per op saying which kernel runs here and why, from the library's own choices."""

import pytest

from vpp import cli
from vpp.transformer import cpu_ops
from vpp.transformer.attention import cpu_kernel

OPS = ["attention (a chunk)", "attention (a decode step)", "MoE experts (SiLU)", "RMSNorm", "RoPE, half rotation",
       "RoPE, interleaved pairs", "host memory of a CPU rank", "accelerator"]


def _table(capsys, *argv) -> dict:
    assert cli.main(["kernels", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("vpp's kernels on this machine, ")
    table = {op: line.split(op, 1)[1].strip() for line in lines[1:] for op in OPS if line.strip().startswith(op)}
    assert list(table) == OPS, lines
    return table


def test_float32_says_which_of_vpps_kernels_run(capsys, monkeypatch):
    monkeypatch.delenv("VPP_CPU_ATTENTION", raising=False)
    monkeypatch.delenv("VPP_CPU_OPS", raising=False)
    monkeypatch.delenv("VPP_HOST_MALLOC", raising=False)
    table = _table(capsys)
    if cpu_kernel.library() is not None:
        assert table["attention (a chunk)"].startswith("vpp's CPU attention kernel")
    else:
        assert table["attention (a chunk)"] == f"torch's CPU flash kernel ({cpu_kernel.unavailable_reason()})"
    if cpu_ops.library() is not None:
        assert table["MoE experts (SiLU)"].startswith("vpp's fused MoE kernel")
        assert table["RMSNorm"] == "vpp's one-pass RMSNorm" and table["RoPE, half rotation"].startswith("vpp's")
    else:
        assert table["RMSNorm"] == f"torch ops ({cpu_ops.unavailable_reason()})"
    assert "fewer than 64 query rows" in table["attention (a decode step)"]
    assert table["host memory of a CPU rank"].startswith("kept for reuse")


def test_bfloat16_and_the_switches_give_their_reasons(capsys, monkeypatch):
    monkeypatch.setenv("VPP_CPU_OPS", "torch")
    monkeypatch.setenv("VPP_HOST_MALLOC", "default")
    table = _table(capsys, "--dtype", "bfloat16")
    assert table["MoE experts (SiLU)"].endswith("(VPP_CPU_OPS=torch)") and table["RMSNorm"] == "torch ops (VPP_CPU_OPS=torch)"
    assert table["attention (a chunk)"] == "torch's CPU flash kernel (vpp's kernels are float32 only)"
    assert table["host memory of a CPU rank"] == "glibc's defaults (VPP_HOST_MALLOC=default)"


def test_an_unusable_forced_kernel_is_its_own_error_line(capsys, monkeypatch):
    monkeypatch.setenv("VPP_CPU_OPS", "vpp")
    monkeypatch.setattr(cpu_ops, "_state", {"lib": None, "why": "no compiler (test)"})
    table = _table(capsys)
    assert table["RMSNorm"] == "error: VPP_CPU_OPS=vpp but vpp's CPU ops (MoE, RMSNorm, RoPE) cannot run here: no compiler (test)"


@pytest.mark.parametrize("env", ["VPP_CPU_ATTENTION", "VPP_CPU_OPS", "VPP_HOST_MALLOC"])
def test_a_bad_switch_is_one_line_before_any_work(env, capsys, monkeypatch):
    monkeypatch.setenv(env, "sometimes")
    assert cli.main(["kernels"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vpp kernels: error: ") and f"{env}='sometimes'" in err[0]
