"""Non-finite numbers are never a result (vpp.runtime.finite): NaN weights in one layer of a tiny model
make prefill raise the same NonFiniteError on every rank, naming the first stage and the layer; Inf
logits in a decode step do the same; --check and vpp generate exit 1 with one line."""

from __future__ import annotations

import pytest
import torch

from vpp.schedules.layout import make_layout
from vpp.runtime.finite import FiniteWatch, NonFiniteError, check_logits, first_nonfinite, raise_nonfinite

BAD_LAYER = 3  # tiny-deepseek, 6 layers: stage 1 on rank 1 holds it (V: layers [2, 4); loop: [3, 6))


def test_watch_and_first_stage():
    w = FiniteWatch()
    w.observe(0, "a", torch.ones(4, 2))
    w.observe(2, "a", torch.tensor([[1.0, float("inf")]]))
    w.observe(2, "a", torch.ones(1, 2))  # a later finite chunk does not clear the flag
    w.observe(3, "b", torch.tensor([float("nan")]))
    w.observe(4, "c", torch.tensor([[2.0, -float("inf")]]))
    w.observe(5, "c", torch.zeros(0, 3))  # an empty output is finite
    assert sorted(w.local()) == [(2, "a"), (3, "b"), (4, "c")]
    # rank 1 saw stage 1 first: the lowest stage wins, whichever rank reports it
    first = first_nonfinite([[(2, "a", None), (3, "b", None)], [], [(1, "b", 3)]])
    assert first == (1, "b", 3)
    layout = make_layout("v", 6, 2)
    with pytest.raises(NonFiniteError, match=r"layer 3 in stage 1 \(layers \[2, 4\)\) on pipeline rank 1 stopped "
                                             r"being finite for request 'b'; every later stage") as e:
        raise_nonfinite(first, layout, dict(enumerate(layout.stage_layers)))
    assert (e.value.stage, e.value.layer, e.value.pp_rank) == (1, 3, 1)
    assert first_nonfinite([[], None]) is None
    assert check_logits(torch.tensor([[0.0, 1.0], [float("-inf"), 0.0]]), ["x", "y"]) == ["y"]


def test_check_report_fails_on_a_nan_difference(capsys):
    """`nan > atol` is false: the report must not count it as a pass."""
    from vpp.cli.prefill_rounds import BenchConfig, MeasuredPrefill
    from vpp.cli.prefill import report
    row = MeasuredPrefill("vpp")
    row.max_abs_diff = float("nan")
    cfg = BenchConfig(model="tiny-deepseek", check=True, schedules=("vpp",), repeat=1)
    facts = {"transfer_s": 0.0, "layouts": {}, "check": {"vpp": float("nan"), "reference_max_abs": 1.0}}
    assert report([row], facts, cfg, as_json=True, atol=1e-3) == 1
    facts["check"]["reference_nonfinite"] = "the unpipelined reference's logits hold NaN or Inf (first at layer 3)"
    row.max_abs_diff = 0.0
    assert report([row], facts, cfg, as_json=True, atol=float("nan")) == 1
    assert "first at layer 3" in capsys.readouterr().err


def _nan_weights(config, bad_layer, value=float("nan")):
    from vpp.models import random_checkpoint
    base = random_checkpoint(config, seed=0)

    def get(name):
        t = base(name)
        if f"layers.{bad_layer}." in name and name.endswith("o_proj.weight"):
            t = torch.full_like(t, value)
        return t
    return get


def _spawned(rank, world, schedule, value):
    from vpp.models import build_stage, model_config
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.parallel import initialize_model_parallel
    from vpp.runtime import Pipeline

    groups = initialize_model_parallel(1, 2)
    config = model_config(TINY_CONFIGS["tiny-deepseek"])
    layout = make_layout("v" if schedule != "cpp" else "loop", 6, 2)
    weights = _nan_weights(config, BAD_LAYER, value)
    stages = [build_stage(config, layout.stage_layers[s], groups, weights=weights) for s in layout.stages_of(groups.pp.rank)]
    ids = torch.arange(40) % 50
    pipe = Pipeline(stages, groups, timeout_s=60)
    out = {}
    try:
        pipe.prefill(ids if groups.pp.rank == 0 else None, 16, schedule=schedule)
    except NonFiniteError as exc:
        out["prefill"] = (str(exc), exc.stage, exc.layer)
    try:
        pipe.generate(ids if groups.pp.rank == 0 else None, 4, 16, schedule=schedule)
    except NonFiniteError as exc:
        out["generate"] = str(exc)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("schedule, value", [("vpp-async", float("nan")), ("cpp", float("inf"))])
def test_every_rank_raises_naming_stage_and_layer(schedule, value, worlds):
    outs = worlds.run(2, _spawned, schedule, value, timeout=240)
    stage = 1
    for out in outs:  # the same error on both ranks
        msg, got_stage, got_layer = out["prefill"]
        assert (got_stage, got_layer) == (stage, BAD_LAYER), msg
        assert f"layer {BAD_LAYER} in stage {stage}" in msg and "on pipeline rank 1" in msg
        assert out["generate"] == msg
    assert outs[0] == outs[1]


def _decode_inf(rank, world):
    """Prefill is finite; the last stage's decode output turns Inf: every rank raises in decode."""
    from vpp.models import build_stage, model_config, random_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.parallel import initialize_model_parallel
    from vpp.runtime import Pipeline

    groups = initialize_model_parallel(1, 2)
    config = model_config(TINY_CONFIGS["tiny-deepseek"])
    layout = make_layout("v", 6, 2)
    stages = [build_stage(config, layout.stage_layers[s], groups, weights=random_checkpoint(config, seed=0))
              for s in layout.stages_of(groups.pp.rank)]
    pipe = Pipeline(stages, groups, timeout_s=60)
    if 1 in pipe.mine:  # stage 1 (layers [2, 4)) on rank 1 goes wrong while decoding only
        stage, real = pipe.mine[1], pipe.mine[1].decode
        stage.decode = lambda x, requests: real(x, requests) * float("inf")
    try:
        pipe.generate(torch.arange(24) % 50 if groups.pp.rank == 0 else None, 4, 8, schedule="vpp")
    except NonFiniteError as exc:
        return str(exc), exc.stage, exc.what
    return None


@pytest.mark.slow
def test_decode_raises_on_every_rank(worlds):
    outs = worlds.run(2, _decode_inf, timeout=240)
    assert outs[0] == outs[1] and outs[0] is not None
    msg, stage, what = outs[0]
    assert (stage, what) == (1, "decode") and "in the decode: the output of stage 1 (layers [2, 4))" in msg, msg


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory):
    from vpp.models import model_config
    from vpp.models.build import save_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    config = model_config(TINY_CONFIGS["tiny-deepseek"])
    path = tmp_path_factory.mktemp("nan") / "model"
    save_checkpoint(config, _nan_weights(config, BAD_LAYER), path)
    return str(path)


@pytest.mark.slow
def test_cli_check_and_generate_exit_1_in_one_line(nan_model, capsys):
    from vpp import cli
    assert cli.main(["prefill", "--model", nan_model, "--check", "--seq-len", "64", "--chunk-size", "32",
                     "--schedule", "cpp,vpp", "--repeat", "1", "--no-warmup", "--no-progress"]) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vpp prefill: error: "), err
    assert f"the output of layer {BAD_LAYER} in stage 1 (layers [3, 6))" in lines[0], lines[0]
    assert cli.main(["generate", "--model", nan_model, "--max-new-tokens", "4", "--seq-len", "24"]) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vpp generate: error: ") and "non-finite" in lines[0], err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_stage_finite_flag_sees_every_kind_of_non_finite(dtype):
    from vpp.transformer.basic import all_finite as _all_finite
    h = torch.randn(33, 17).to(dtype)
    assert bool(_all_finite(h)) and bool(_all_finite(h[:0]))
    for bad in (float("nan"), float("inf"), -float("inf")):
        for where in ((0, 0), (20, 9), (32, 16)):
            x = h.clone()
            x[where] = bad
            assert not bool(_all_finite(x)), (bad, where)
