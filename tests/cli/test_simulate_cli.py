"""``python -m vpp simulate``."""

import json
import os
import subprocess
import sys

import pytest

from vpp import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_table(capsys):
    assert cli.main(["simulate", "--pp", "2", "--layout", "v", "--seq-len", "65536", "--chunk-size", "8192"]) == 0
    out = capsys.readouterr().out
    assert "CPP" in out and "VPP-Async" in out and "Bubble ratio" in out and "v layout, pp=2" in out


def test_json_shows_vpp_beating_cpp(capsys):
    cli.main(["simulate", "--pp", "2", "--seq-len", "65536", "--chunk-size", "8192", "--json", "--latency", "1e-9",
              "--bandwidth", "1e15"])
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert set(plans) == {"CPP", "VPP", "VPP-Async"}
    assert plans["VPP"]["bubble_ratio"] < plans["CPP"]["bubble_ratio"]
    assert plans["VPP"]["makespan"] < plans["CPP"]["makespan"]


def test_flops_folds_and_files(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    args = ["simulate", "--pp", "2", "--layout", "v", "--folds", "2", "--seq-len", "9000", "3000",
            "--chunk-size", "2048", "--cost", "flops", "--trace-dir", str(tmp_path), "--png-dir", str(tmp_path)]
    assert cli.main(args) == 0
    names = sorted(os.listdir(tmp_path))
    assert "vpp-async.png" in names and "cpp.trace.json" in names and "vpp.chrome.json" in names
    assert "flops cost" in capsys.readouterr().out


@pytest.mark.slow
def test_planning_imports_neither_torch_nor_matplotlib():
    code = ("import sys, vpp.schedules, vpp.cli.simulate; "
            "print('torch' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.slow
def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "vpp", "simulate", "--pp", "3", "--layout", "interleaved",
                          "--seq-len", "4000", "--chunk-size", "1000"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "interleaved layout, pp=3" in out.stdout


def _plans(capsys, *args):
    assert cli.main(["simulate", "--json", "--seq-len", "16384", "--chunk-size", "4096", *args]) == 0
    return json.loads(capsys.readouterr().out)["plans"]


def test_cp_stages_cost_the_model_split_over_cp_ranks(capsys):
    """--model --cp: each stage on CP ranks (ContextParallelCost); cp=1 is the model's plain deployment
    cost; the VPP-Async makespan equals the runner's on the same cost and layout."""
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.perf.arch import Arch
    from vpp.perf.deployment import DeploymentCost
    from vpp.perf.hardware import CPU
    from vpp.perf.ops import Parallel
    from vpp.schedules import make_layout
    from vpp.schedules.runner import simulate
    one = _plans(capsys, "--model", "tiny-qwen", "--pp", "2", "--cp", "1")
    two = _plans(capsys, "--model", "tiny-qwen", "--pp", "2", "--cp", "2")
    arch = Arch.from_config(TINY_CONFIGS["tiny-qwen"], name="tiny-qwen")
    layout = make_layout("v", arch.layers, 2)
    plain = DeploymentCost(arch, CPU, layout, Parallel(act_bytes=2, weight_bytes=2, kv_bytes=2))
    want = simulate("vpp-async", layout, 16384, plain, chunk_size=4096).summary.makespan
    assert one["VPP-Async"]["makespan"] == pytest.approx(want)
    for name in ("CPP", "VPP", "VPP-Async"):
        assert one[name]["makespan"] / 2 < two[name]["makespan"] < one[name]["makespan"]


@pytest.mark.parametrize("args,message", [
    (["--pp", "2", "--cp", "2"], "need --model"),
    (["--pp", "2", "--model", "tiny-glm", "--cp", "2"], "DSA"),
    (["--pp", "2", "--model", "no-such-model"], "--model no-such-model"),
    (["--pp", "2", "--model", "tiny-qwen", "--device", "tpu"], "--device tpu"),
])
def test_cp_combinations_that_cannot_be_simulated_are_one_line(args, message, capsys):
    assert cli.main(["simulate", "--seq-len", "16384", "--chunk-size", "4096", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
