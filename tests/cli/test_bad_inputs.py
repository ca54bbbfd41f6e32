"""Every bad input of every command: one line on stderr, ``vpp <command>: error: ...``, before any
rank starts (these run in-process; tests/conftest.py fails a test that starts a process), exit code 2
for arguments and files, 1 for a run that cannot succeed (a tuning with nothing that fits)."""

from __future__ import annotations

import json

import pytest

from vpp import cli
from vpp.models.tiny import TINY_CONFIGS


def _model_dirs(tmp_path):
    only_config = tmp_path / "only-config"
    only_config.mkdir()
    (only_config / "config.json").write_text(json.dumps(TINY_CONFIGS["tiny-deepseek"]))
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({**TINY_CONFIGS["tiny-deepseek"], "model_type": "llama"}))
    (llama / "model.safetensors").write_bytes(b"")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "deepseek_v3",')
    (broken / "model.safetensors").write_bytes(b"")
    return {"only-config": str(only_config), "llama": str(llama), "broken": str(broken)}


CASES = [
    # (argv, code, the message)
    ("generate --decode-pp 2", 2, r"--decode-pp needs --decode-tp"),
    ("generate --decode-tp 2 --save-kv /tmp/x", 2, r"--decode-tp hands the caches over between ranks; --save-kv / --load-kv"),
    ("generate --decode-tp 3", 2, r"cpp with --tp 3 --pp 1 on tiny-deepseek: num_attention_heads=8 is not divisible by tp=3"),
    ("generate --load-kv /nonexistent", 2, r"--load-kv /nonexistent: .*manifest.json: not a readable KV directory manifest"),
    ("prefill --pp 8", 2, r"cpp with --tp 1 --pp 8 on tiny-deepseek: 6 layers with stage starts \[0, 1, 2, 3, 4, 5\] allow 6 stages, 8 asked for"),
    ("prefill --tp 3", 2, r"num_attention_heads=8 is not divisible by tp=3"),
    ("prefill --model tiny-glm --tp 3 --pp 1 --schedule cpp", 2, r"num_attention_heads=8 is not divisible by tp=3"),
    ("prefill --model tiny-glm --pp 4 --schedule vpp", 2, r"6 layers with stage starts \[0, 1, 3, 5\] allow 4 stages, 8 asked for"),
    ("prefill --model /nonexistent", 2, r"unknown model '/nonexistent': give one of .* or a model directory"),
    ("prefill --model {only-config}", 2, r"neither model.safetensors nor model.safetensors.index.json"),
    ("prefill --model {llama}", 2, r"model_type='llama' is not supported"),
    ("prefill --model {broken}", 2, r"config.json: not valid JSON: .* line 1 column"),
    ("prefill --save-logits /nonexistent/x.safetensors", 2, r"--save-logits /nonexistent/x.safetensors: the folder /nonexistent does not exist"),
    ("prefill --trace /proc/vpp-trace", 2, r"--trace /proc/vpp-trace: /proc is not writable"),
    ("prefill --timeout 0", 2, r"argument --timeout: must be a number > 0, got 0"),
    ("prefill --threads 0", 2, r"argument --threads: must be an integer >= 1, got 0"),
    ("prefill --seq-len -5", 2, r"argument --seq-len: must be an integer >= 1, got -5"),
    ("prefill --schedule cpp,fast", 2, r"--schedule: unknown strategy 'fast'"),
    ("prefill --chunk-size abc", 2, r"argument --chunk-size: must be an integer, got 'abc'"),
    ("simulate --pp 2 --seq-len 4096 --chunk-size 512 --bandwidth 0", 2, r"argument --bandwidth: must be a number > 0, got 0"),
    ("simulate --pp 2 --seq-len 4096 --chunk-size 512 --t -1", 2, r"argument --t: must be a number > 0, got -1"),
    ("simulate --pp 2 --seq-len 4096 --chunk-size 512 --latency=-1e-3", 2, r"argument --latency: must be a number > 0"),
    ("simulate --pp 2 --seq-len 4096 --chunk-size 512 --overlap 1.5", 2, r"argument --overlap: must lie in \[0, 1\], got 1.5"),
    ("simulate --pp 2 --seq-len 10000000 --chunk-size 1", 2, r"cuts 10000000 tokens into 10000000 chunks, 40000000 stage computes over 4 stages; the simulator's limit is 200000"),
    ("simulate --pp 4 --layers 6 --seq-len 4096 --chunk-size 512", 2, r"num_layers=6 cannot fill 8 virtual stages"),
    ("serve-sim --pp 0", 2, r"argument --pp: must be an integer >= 1, got 0"),
    ("serve-sim --strategies cpp nope", 2, r"--strategies: unknown strategy 'nope'"),
    ("serve-bench --pp 0", 2, r"argument --pp: must be an integer >= 1, got 0"),
    ("serve-bench --repeat 0", 2, r"argument --repeat: must be an integer >= 1, got 0"),
    ("serve-bench --n 5", 2, r"--n applies to --workload mixed or short, not long"),
    ("serve-bench --workload mixed --lengths 65536", 2, r"--lengths applies to --workload long, not mixed"),
    ("serve-sim --n 5", 2, r"--n applies to --workload short or mixed, not long"),
    ("serve-sim --workload short --repeat 3", 2, r"--repeat applies to --workload long, not short"),
    ("serve-sim --workload mixed --length 4096", 2, r"--length applies to --workload short, not mixed"),
    ("serve-bench --n 0", 2, r"argument --n/--requests: must be an integer >= 1, got 0"),
    ("serve-bench --contenders cpp,fast", 2, r"--contenders: unknown strategy 'fast'"),
    ("serve-bench --workload mixed --chunk-size 512 --contenders cpp,gpipe", 2,
     r"--contenders gpipe needs prompt lengths that are multiples of --chunk-size 512"),
    ("tune --device tpu", 2, r"unknown device"),
    ("tune --model nomodel", 2, r"unknown model 'nomodel'"),
    ("tune --length 99999999999", 2, r"--chunks 8192 cuts 99999999999 tokens into 12207032 chunks, 97656256 stage "
     r"computes over 8 stages; tune's limit per simulation .* is 32768"),
    ("tune --max-folds 100000", 2, r"--chunks 8192 cuts 524288 tokens into 64 chunks, 25600000 stage computes over "
     r"400000 stages; tune's limit"),
    ("simulate --pp 2 --folds 100000 --seq-len 4096 --chunk-size 512", 2,
     r"cuts 4096 tokens into 8 chunks, 3200000 stage computes over 400000 stages; the simulator's limit is 200000"),
    ("serve-sim --folds 5000 --layers 20000", 2, r"stage computes over 20000 stages; the simulator's limit is 200000"),
    ("tune --chunks 8192,0", 2, r"argument --chunks: must be comma-separated integers >= 1"),
    ("tune --model deepseek-v3.1 --device h100 --tp 1 --pp 1 --length 65536", 1,
     r"none of \d+ configurations of deepseek-v3.1 at tp=1 pp=1 for 65536 tokens fits in h100-sxm's 80.0 GB: "
     r"the smallest needs [\d.]+ GB on its busiest device \(weights [\d.]+ GB, kv_cache [\d.]+ GB"),
    ("calibrate --tokens 0", 2, r"argument --tokens: must be an integer >= 1, got 0"),
    ("calibrate --tokens 1000000000", 2, r"--tokens 1000000000 is 1000000000 tokens, more than the model's \d+ positions"),
    ("calibrate --chunk 1024 --tokens 512", 2, r"--chunk 1024 is longer than --tokens 512"),
    ("nosuchcommand", 2, r"argument COMMAND: invalid choice: 'nosuchcommand'"),
]


@pytest.mark.parametrize("argv, code, message", CASES, ids=[c[0] for c in CASES])
def test_one_line_and_the_right_exit_code(tmp_path, capsys, argv, code, message):
    args = argv.format(**_model_dirs(tmp_path)).split()
    assert cli.main(args) == code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    command = "vpp" if args[0] == "nosuchcommand" else f"vpp {args[0]}"
    assert lines[0].startswith(f"{command}: error: "), lines[0]
    assert pytest.importorskip("re").search(message, lines[0]), lines[0]
    assert out == ""


def test_debug_shows_the_traceback(capsys):
    assert cli.main(["prefill", "--tp", "3", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("vpp prefill: error: ")
