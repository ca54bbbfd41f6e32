"""``vpp tune`` prints, for each row, the command that runs its deployment, and the runtime accepts
every one: each distinct (cp, tp, pp, schedule, folds) the tuner can recommend (its whole candidate
space on a GQA and an MLA model, CP rows included), scaled down to tiny-qwen (8 layers) on at most 4 ranks,
passes ``vpp prefill``'s checks (the split over the grid built on the meta device, the memory plan)
in this process. The scaled runtime paths themselves run in tests/cli/test_cp_cli.py (CP alone, CP x
PP under torchrun) and tests/cli/test_prefill_cli.py (PP)."""

from __future__ import annotations

import shlex

import pytest

from vpp.cli import build_parser
from vpp.cli import prefill
from vpp.cli.tune import command, deployment
from vpp.perf.deployment_search import candidates
from vpp.perf.hardware import get_device
from vpp.perf.runs import paper_setup

LENGTH = 524288


def _setups():
    device = get_device("910c")
    return [paper_setup(m, device, tp=8, pp=2) for m in ("qwen3-coder-30b-a3b", "deepseek-v3.1")]


def _rows():
    return [(c, s) for s in _setups() for c in candidates(s, max_folds=2)]


def _parse(line: str):
    words = shlex.split(line)
    assert words[:2] == ["torchrun", "--nproc-per-node"] and words[3:6] == ["-m", "vpp", "prefill"], line
    return int(words[2]), build_parser("prefill").parse_args(words[5:])


def test_every_runnable_row_prints_the_command_of_its_deployment():
    rows = _rows()
    assert any(c.cp > 1 and (c.pp or 2) > 1 for c, _ in rows)  # VPP-Async x CP rows are among them
    for cand, setup in rows:
        line, d = command(cand, setup, LENGTH), deployment(cand, setup)
        if d is None:
            assert line.startswith("(no vpp prefill schedule runs") and cand.kind == "interleaved", line
            continue
        ranks, args = _parse(line)
        assert ranks == setup.devices == args.cp * args.tp * args.pp  # the tuner's devices, regrouped
        assert (args.cp, args.tp, args.pp, args.seq_len, args.chunk_size) == (
            d["cp"], d["tp"], d["pp"], LENGTH, cand.chunk)
        if args.pp > 1:
            assert (args.schedule, args.folds) == (d["schedule"], d["folds"])


def _scaled() -> list[dict]:
    """Each distinct (cp, tp, pp, schedule, folds) of the rows, with its printed command and the sizes
    scaled to at most 4 ranks."""
    out = {}
    for cand, setup in _rows():
        d = deployment(cand, setup)
        if d is None:
            continue
        cp, pp = min(d["cp"], 2), min(d["pp"], 2)
        key = (d["cp"], d["tp"], d["pp"], d["schedule"], d["folds"])
        out[key] = dict(cp=cp, tp=min(d["tp"], 4 // (cp * pp), 2), pp=pp, schedule=d["schedule"], folds=d["folds"],
                        line=command(cand, setup, LENGTH))
    return list(out.values())


SCALED = _scaled()


@pytest.fixture(scope="module")
def tiny_qwen_8(tmp_path_factory):
    """tiny-qwen with 8 layers (a V of 2 folds on 2 ranks has 8 stages), as a model directory."""
    from vpp.models import model_config, random_checkpoint, save_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    cfg = model_config(dict(TINY_CONFIGS["tiny-qwen"], num_hidden_layers=8))
    path = tmp_path_factory.mktemp("tune") / "tiny-qwen-8"
    save_checkpoint(cfg, random_checkpoint(cfg, seed=0), str(path))
    return str(path)


@pytest.mark.parametrize("d", SCALED, ids=lambda d: "cp{cp}-tp{tp}-pp{pp}-{schedule}-f{folds}".format(**d))
def test_every_distinct_deployment_scaled_down_passes_the_runtime_checks(d, tiny_qwen_8):
    words = shlex.split(d["line"])[5:]  # the printed command after "-m vpp", its sizes scaled down
    scaled = {"--model": tiny_qwen_8, "--cp": d["cp"], "--tp": d["tp"], "--pp": d["pp"], "--seq-len": 64,
              "--chunk-size": 16}
    argv = [str(scaled.get(words[i - 1], w)) if i else w for i, w in enumerate(words)] + ["--device", "cpu"]
    args = build_parser("prefill").parse_args(argv)
    prefill.check(args)  # raises UsageError (one line) on anything the runtime would refuse
    assert args.cp * args.tp * args.pp <= 4 and (args.pp == 1 or args.schedule == d["schedule"])
