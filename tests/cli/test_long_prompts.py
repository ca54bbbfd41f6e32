"""Long prompts with the built-in models: 131072 tokens pass the checks without a config edit, a single
round warms up on a short prompt only, and the --timeout default grows with the planned work (an
explicit shorter one is warned about). In-process: nothing here starts a rank."""

from __future__ import annotations

import argparse

from vpp.cli import prefill
from vpp.cli.planned_work import BASE_TIMEOUT_S, SLACK, planned_seconds, timeout_for
from vpp.cli.prefill_rounds import SHORT_WARMUP, BenchConfig, warmup_tokens
from vpp.models import model_config
from vpp.models.tiny import TINY_CONFIGS


def _checked(*argv):
    p = argparse.ArgumentParser()
    prefill.add_arguments(p)
    args = p.parse_args(list(argv))
    prefill.check(args)
    return args


def test_131072_tokens_pass_the_checks_and_the_timeout_grows_with_them(capsys):
    args = _checked("--model", "tiny-glm", "--seq-len", "131072", "--chunk-size", "16384", "--schedule", "vpp-async",
                    "--repeat", "1", "--device", "cpu")
    estimate = planned_seconds(model_config(TINY_CONFIGS["tiny-glm"]), tokens=131072, tp=1, runs=1)
    assert args.timeout == round(SLACK * estimate) > BASE_TIMEOUT_S
    assert _checked("--seq-len", "1024", "--chunk-size", "256", "--device", "cpu").timeout == BASE_TIMEOUT_S
    assert capsys.readouterr().err == ""


def test_an_explicit_timeout_shorter_than_the_work_is_warned_about(capsys):
    config = model_config(TINY_CONFIGS["tiny-deepseek"])
    assert timeout_for(60.0, config, tokens=65536, tp=1, runs=3, device="cpu", command="prefill") == 60.0
    err = capsys.readouterr().err
    assert err.startswith("vpp prefill: warning: --timeout 60 s may expire before the work is done: the cost model "
                          "estimates ") and "for 3 prefill runs of 65536 tokens" in err
    assert timeout_for(1e6, config, tokens=65536, tp=1, runs=3, device="cpu", command="prefill") == 1e6
    assert capsys.readouterr().err == ""


def test_a_single_round_warms_up_on_a_short_prompt():
    assert warmup_tokens(BenchConfig(seq_len=131072, chunk_size=16384, repeat=1)) == SHORT_WARMUP == 256
    assert warmup_tokens(BenchConfig(seq_len=131072, chunk_size=16384, repeat=5)) == 32768  # the timed shapes
    assert warmup_tokens(BenchConfig(seq_len=100, chunk_size=64, repeat=1)) == 100
