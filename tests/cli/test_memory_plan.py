"""The position limit and the memory plan are checked in the parent, before any rank starts (these run
in-process: tests/conftest.py fails a fast test that starts a process); the plan's parts against
closed-form figures of the tiny model."""

from __future__ import annotations

import re

import pytest

from vpp import cli
from vpp.perf.arch import Arch
from vpp.perf.memory_plan import CPU_WORKSPACE, RankMemoryPlan, plan_memory, shortfall


def _one_line(capsys, argv, code, pattern):
    assert cli.main(argv) == code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vpp {argv[0]}: error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def test_a_billion_tokens_is_refused_before_any_prompt_is_built(capsys):
    _one_line(capsys, ["prefill", "--seq-len", "1000000000"], 2,
              r"--seq-len 1000000000 is 1000000000 tokens, more than the model's 1048576 positions")
    _one_line(capsys, ["generate", "--seq-len", "1048570", "--max-new-tokens", "16"], 2,
              r"--seq-len 1048570 plus --max-new-tokens 16 is 1048586 tokens, more than the model's 1048576 positions")


def test_an_over_long_prompt_file_is_refused(tmp_path, capsys):
    from tests.models.fp8_tiny import WORDS, save_tokenizer
    from vpp.models import model_config, random_checkpoint
    from vpp.models.build import save_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    config = model_config(dict(TINY_CONFIGS["tiny-deepseek"], max_position_embeddings=64))
    save_checkpoint(config, random_checkpoint(config, seed=0), tmp_path / "m")
    save_tokenizer(tmp_path / "m")
    text = tmp_path / "long.txt"
    text.write_text(" ".join(WORDS[i % len(WORDS)] for i in range(100)))
    _one_line(capsys, ["prefill", "--model", str(tmp_path / "m"), "--prompt-file", str(text)], 2,
              r"the prompt of --prompt-file .*long.txt is 101 tokens, more than the model's 64 positions")


def test_a_plan_that_does_not_fit_is_refused_with_figures(tmp_path, capsys, monkeypatch):
    from vpp.cli import memory_check
    monkeypatch.setattr(memory_check, "cpu_available", lambda: 100 * 2 ** 20)
    line = _one_line(capsys, ["prefill", "--seq-len", "4096", "--chunk-size", "1024", "--device", "cpu"], 2,
                     r"cpp: 4096 tokens in chunks of 1024 do not fit this machine's memory .*: 2 ranks need \d+ MiB "
                     r"together, 100 MiB available; busiest rank \d: [\d.]+ MiB \(weights [\d.]+, KV cache 7.5, "
                     r"activations [\d.]+, runtime \d+\)")
    assert "KV cache 7.5" in line  # 4096 tokens x 3 layers x (128 + 32) x 4 bytes = 7.5 MiB
    # a model whose positions allow it, but not the memory: a checkpoint claiming 2^30 positions
    from vpp.models import model_config, random_checkpoint
    from vpp.models.build import save_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    monkeypatch.undo()
    config = model_config(dict(TINY_CONFIGS["tiny-deepseek"], max_position_embeddings=2 ** 30))
    save_checkpoint(config, random_checkpoint(config, seed=0), tmp_path / "big")
    _one_line(capsys, ["prefill", "--model", str(tmp_path / "big"), "--seq-len", "100000000", "--device", "cpu",
                       "--schedule", "cpp", "--partition", "even"], 2,
              r"KV cache 183105.5")  # 1e8 tokens x 1920 B per rank = 183105.5 MiB


def test_plan_parts_closed_form():
    """tiny-deepseek (MLA: kv_lora 128 + rope 32 cached values per token and layer, hidden 256) in fp32."""
    from vpp.models import model_config
    from vpp.models.tiny import TINY_CONFIGS
    arch = Arch.from_config(model_config(TINY_CONFIGS["tiny-deepseek"]))
    plans = plan_memory(arch, [[0, 1, 2], [3, 4, 5]], tp=1, dtype_bytes=4, tokens=4096, chunk=1024,
                        weights=[10, 20], runtime=7)
    assert [p.kv_cache for p in plans] == [4096 * 3 * 160 * 4] * 2
    assert [p.weights for p in plans] == [10, 20]
    chunk_out = 1024 * 256 * 4
    # activations: workspace + 4 hidden buffers + routed experts' intermediate + 2 outputs in flight (+ ids)
    moe = 1024 * arch.top_k * 3 * arch.moe_ffn * 4
    assert plans[1].activations == CPU_WORKSPACE + 4 * chunk_out + moe + 2 * chunk_out
    assert plans[0].activations == plans[1].activations + 8 * 4096  # the prompt's ids on the first rank
    assert plans[0].total == plans[0].weights + plans[0].kv_cache + plans[0].activations + 7
    tight = [RankMemoryPlan(0, 60, 0, 0), RankMemoryPlan(1, 50, 0, 0)]
    assert shortfall(tight, 110, shared=True) is None
    assert shortfall(tight, 109, shared=True).startswith("2 ranks need 0 MiB together")
    assert shortfall(tight, 60, shared=False) is None and "rank 0 needs" in shortfall(tight, 59, shared=False)


@pytest.mark.slow
def test_prefill_json_prints_the_plan_beside_the_measured_peaks(cpp_prefill):
    """``vpp prefill --json --seq-len 512 --chunk-size 128 --schedule cpp`` (tests/cli/conftest.py)."""
    for m in cpp_prefill.printed["memory"]["cpp"]:
        assert m["plan"]["weights"] == m["measured_weights_bytes"]  # exact: the meta-built stages' parameters
        assert m["plan"]["kv_cache"] == m["measured_kv_cache_bytes"]  # exact: caches reserved at the prompt
        assert m["plan_over_measured"] > 0 and m["measured_peak_bytes"] > 0
