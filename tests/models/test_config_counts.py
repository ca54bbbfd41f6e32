"""A config.json whose types or counts do not fit the checkpoint is one line naming the key and the file,
in the parent, before anything is built per layer or expert (in-process: no rank starts)."""

from __future__ import annotations

import json

import pytest

from vpp import cli
from vpp.models import random_checkpoint, save_checkpoint
from vpp.models.tiny import TINY_CONFIGS


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("model")
    save_checkpoint(TINY_CONFIGS["tiny-qwen"], random_checkpoint(TINY_CONFIGS["tiny-qwen"], 0), out)
    return out


CASES = [
    ({"num_hidden_layers": 10**9}, "num_hidden_layers=1000000000, but the checkpoint's safetensors headers hold 6 layers"),
    ({"num_experts": 10**8}, "num_experts=100000000, but the checkpoint's safetensors headers hold 16 experts per layer"),
    ({"max_position_embeddings": "2048"}, "max_position_embeddings='2048' must be an integer >= 1"),
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps='1e-6' must be a finite number > 0"),
    ({"norm_topk_prob": 1}, "norm_topk_prob=1 must be true or false"),
    ({"num_hidden_layers": True}, "num_hidden_layers=True must be a positive integer"),
]


def _refused(capsys, saved, tmp_path, change, message, command="prefill"):
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").symlink_to(saved / "model.safetensors")
    (model / "config.json").write_text(json.dumps({**json.loads((saved / "config.json").read_text()), **change}))
    assert cli.main([command, "--model", str(model)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"vpp {command}: error: "), err
    assert f"{model / 'config.json'}: {message}" in err[0], err[0]


@pytest.mark.parametrize("change, message", CASES, ids=[repr(c[0])[:30] for c in CASES])
def test_config_against_the_headers(saved, tmp_path, capsys, change, message):
    _refused(capsys, saved, tmp_path, change, message)


def test_every_command_checks_the_counts_first(saved, tmp_path, capsys):
    _refused(capsys, saved, tmp_path, *CASES[1], command="serve-bench")
