"""``vpp prefill --cp N`` and ``vpp generate --cp N``: impossible combinations refused in one line before
any rank starts; a CP2 prefill matches the unsplit forward and keeps half the tokens per rank; greedy
tokens after a CP2 prefill equal those of one rank; the tuner's top CP x PP row, as printed and scaled to
CP2 x PP2, under torchrun (4 ranks) matches the unpipelined forward, with each rank's memory plan (its stages' weights, its CP share of the KV cache)
equal to what it measured."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vpp import cli


def _one_line(capsys, argv, pattern):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"vpp {argv[0]}: error: "), err
    assert re.search(pattern, err[0]), err[0]


@pytest.mark.parametrize("argv,pattern", [
    (["prefill", "--cp", "2", "--pp", "1", "--schedule", "vpp"], r"--schedule cannot be combined with --cp 2 --pp 1 "
                                                                  r"\(it shapes a pipeline: give --pp 2 or more\)"),
    (["prefill", "--cp", "4", "--seq-len", "6"], r"2 \* cp = 8 pieces, more than the 6 tokens"),
    (["prefill", "--cp", "4", "--seq-len", "64", "--cached-prefix", "60"], r"more than the 4 tokens"),
    (["prefill", "--cp", "2", "--chunk-size", "3", "--seq-len", "64"], r"--chunk-size 3 is smaller than 2 \* cp = 4"),
    (["prefill", "--cp", "2", "--folds", "2"], r"--folds cannot be combined with --cp 2 --pp 1"),
    (["prefill", "--cp", "2", "--pp", "2", "--chunk-size", "3", "--seq-len", "64"], r"--chunk-size 3 is smaller"),
    (["generate", "--cp", "2", "--pp", "2", "--decode-cp", "2"], r"--decode-cp needs --decode-tp"),
    (["generate", "--cp", "3", "--seq-len", "5"], r"2 \* cp = 6 pieces, more than the 5 tokens"),
])
def test_impossible_cp_combinations_are_one_line_errors(capsys, argv, pattern):
    _one_line(capsys, argv + ["--model", "tiny-qwen"], pattern)


def test_the_toy_model_has_no_attention_to_split(capsys):
    _one_line(capsys, ["prefill", "--model", "toy", "--cp", "2"], r"the toy model has no attention to split")


@pytest.mark.slow
def test_prefill_cp2_checks_against_the_unsplit_forward_and_shards_the_cache(capsys):
    argv = ["prefill", "--model", "tiny-deepseek", "--cp", "2", "--seq-len", "160", "--chunk-size", "32",
            "--repeat", "1", "--no-warmup", "--check", "--json", "--device", "cpu"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_abs_diff"] <= 1e-3
    assert sorted(r["kv_rows"] for r in out["ranks"]) == [80, 80]  # 160 tokens, half on each rank
    # the plan reserves ceil(160 / 2) + 2 cp = 84 rows per rank, and that is what each rank allocated
    assert all(r["kv_cache_bytes"] == out["memory_plan"]["kv_cache"] for r in out["ranks"])
    # tiny-deepseek: latent / queries = 160 / (8 x 96) = 0.21; the last chunk's 32 / 160 = 0.2 is below
    assert out["methods"] == ["pass-kv"] * 4 + ["pass-q"]


@pytest.mark.slow
def test_generate_cp2_greedy_equals_one_rank(capsys):
    base = ["generate", "--model", "tiny-glm", "--seq-len", "300", "--chunk-size", "128", "--max-new-tokens", "4",
            "--json"]
    assert cli.main(base + ["--cp", "2"]) == 0
    cp = json.loads(capsys.readouterr().out)
    assert cli.main(base + ["--pp", "1", "--schedule", "cpp"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert cp["generated_ids"] == one["generated_ids"] and cp["cp"] == 2


def _top_cp_pp_row() -> str:
    """The command ``vpp tune`` prints under its best VPP-Async x CP row (its defaults: deepseek-v3.1 on
    the 910C, tp 8 x pp 2, 524288 tokens): the fastest CP x PP candidate that fits, as tune ranks them."""
    from vpp.cli.tune import command
    from vpp.perf.deployment_search import cp_candidates, evaluate
    from vpp.perf.hardware import get_device
    from vpp.perf.runs import paper_setup
    setup = paper_setup("deepseek-v3.1", get_device("910c"), tp=8, pp=2)
    rows = [evaluate(setup, c, 524288) for c in cp_candidates(setup) if c.pp > 1]
    return command(min((r for r in rows if r.fits), key=lambda r: r.ttft).candidate, setup, 524288)


@pytest.mark.slow
def test_the_tuners_top_cp_pp_row_runs_under_torchrun_and_checks_and_plans_every_rank():
    """The printed command as it is, its sizes scaled down (tiny-qwen, cp 2 x tp 1 x pp 2 = 4 ranks, 96
    tokens in chunks of 32)."""
    import shlex
    root = Path(__file__).resolve().parents[2]
    words = shlex.split(_top_cp_pp_row())
    assert words[:2] == ["torchrun", "--nproc-per-node"] and "--cp" in words and "--pp" in words, words
    scaled = {"--nproc-per-node": 4, "--model": "tiny-qwen", "--cp": 2, "--tp": 1, "--pp": 2, "--seq-len": 96,
              "--chunk-size": 32}
    words = [str(scaled.get(words[i - 1], w)) if i else w for i, w in enumerate(words)]
    schedule = words[words.index("--schedule") + 1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", *words[1:],
           "--check", "--json", "--repeat", "1", "--no-warmup", "--no-progress"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["config"]["cp"] == 2 and out["check"][schedule] <= 1e-3
    ranks = out["memory"][schedule]
    assert [(m["rank"], m["pp_rank"]) for m in ranks] == [(0, 0), (1, 0), (2, 1), (3, 1)]  # tp-cp-pp order
    for m in ranks:
        assert m["plan"]["weights"] == m["measured_weights_bytes"]
        # each CP rank reserved its share, ceil(96 / 2) + 2 cp = 52 rows per layer, as the plan says
        assert m["plan"]["kv_cache"] == m["measured_kv_cache_bytes"]
