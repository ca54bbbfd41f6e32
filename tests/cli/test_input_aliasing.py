"""An output path that is one of the run's inputs (the checkpoint, its config, the prompt file, a KV
directory being loaded), by resolved path or by inode (a hard link), is refused in one line before any
work (exit 2), and the input is left as it was (in-process: no rank starts)."""

from __future__ import annotations

import os

import pytest

from vpp import cli
from vpp.models import random_checkpoint, save_checkpoint
from vpp.models.tiny import TINY_CONFIGS


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("model")
    cfg = TINY_CONFIGS["tiny-qwen"]
    save_checkpoint(cfg, random_checkpoint(cfg, 0), out)
    return out


def _refused(capsys, argv, message):
    assert cli.main([str(a) for a in argv]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vpp {argv[0]}: error: "), err
    assert message in lines[0], lines[0]
    assert out == ""


def test_save_logits_over_the_checkpoint(model_dir, capsys):
    weights = model_dir / "model.safetensors"
    before = weights.read_bytes()
    _refused(capsys, ["prefill", "--model", model_dir, "--save-logits", weights],
             f"--save-logits {weights} is {weights}, which this run reads (--model)")
    assert weights.read_bytes() == before


def test_save_logits_through_a_symlink_and_a_hard_link(model_dir, tmp_path, capsys):
    config = model_dir / "config.json"
    (tmp_path / "link").symlink_to(config)
    _refused(capsys, ["prefill", "--model", model_dir, "--save-logits", tmp_path / "link"],
             f"is {config}, which this run reads (--model)")
    os.link(config, tmp_path / "hard")
    _refused(capsys, ["prefill", "--model", model_dir, "--save-logits", tmp_path / "hard"],
             f"is a hard link to {config}")


def test_save_logits_over_the_prompt_file(model_dir, tmp_path, capsys):
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello")
    _refused(capsys, ["prefill", "--model", model_dir, "--prompt-file", prompt, "--save-logits", prompt],
             f"--save-logits {prompt} is {prompt}, which this run reads (--prompt-file)")
    assert prompt.read_text() == "hello"


def test_trace_into_the_model_folder(model_dir, capsys):
    _refused(capsys, ["prefill", "--model", model_dir, "--schedule", "cpp", "--trace", model_dir],
             f"--trace {model_dir} is {model_dir}, which this run reads (--model)")


def test_save_kv_into_the_model_folder(model_dir, tmp_path, capsys):
    (tmp_path / "m").symlink_to(model_dir)
    _refused(capsys, ["generate", "--model", model_dir, "--save-kv", tmp_path / "m"],
             f"--save-kv {tmp_path / 'm'} is {model_dir}, which this run reads (--model)")


def test_a_separate_output_is_accepted(model_dir, tmp_path):
    from vpp.cli.aliasing import input_problem, reading
    from argparse import Namespace
    with reading(Namespace(model=str(model_dir), prompt_file=None)):
        assert input_problem(str(tmp_path / "logits.safetensors"), "--save-logits") is None
        assert input_problem(str(model_dir / "config.json"), "--save-logits") is not None
