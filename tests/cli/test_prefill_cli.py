"""``vpp prefill`` end to end, once, on spawned CPU ranks (every schedule on a tiny FP8 checkpoint in the
official layout at TP 2 x PP 2 with a text prompt, --check, --save-logits, --trace; through ``vpp.cli.main``
in this process, which spawns the ranks as the command does: ``python -m vpp prefill`` as a process runs
under torchrun in tests/cli/test_cp_cli.py); its --check verdict, the table, the why line, and the
refusals that end the command before any rank starts (exit status 2, one line). Every family's parity
runs on the persistent worlds (tests/models, tests/runtime): the command's wiring is the same for each."""

import pytest
import json
import shutil

import torch
from safetensors.torch import load_file

from vpp.cli.prefill import report
from vpp.cli.prefill_rounds import BenchConfig, MeasuredPrefill


def test_check_failure_is_loud(capsys):
    cfg = BenchConfig(model="toy", check=True)
    rows = [MeasuredPrefill("cpp", ttft=[1.0], max_abs_diff=0.5), MeasuredPrefill("vpp", ttft=[1.0], max_abs_diff=1e-7)]
    facts = {"transfer_s": 0.0, "layouts": {}, "check": {"cpp": 0.5, "vpp": 1e-7}}
    assert report(rows, facts, cfg, as_json=False, atol=1e-3) == 1
    assert "CHECK FAILED: logits of ['cpp'] differ" in capsys.readouterr().err
    rows[0].max_abs_diff = 1e-6
    assert report(rows, facts, cfg, as_json=False, atol=1e-3) == 0
    rows[0].max_abs_diff = 0.5
    cfg = BenchConfig(model="toy", check=True, dtype="bfloat16")
    assert report(rows, facts, cfg, as_json=False, atol=0.25) == 1
    assert "in bfloat16 a top-k of the MoE router or the DSA indexer can flip" in capsys.readouterr().err


def test_the_table_shows_each_ranks_kv_cache_beside_its_peak(capsys):
    memory = [{"rank": 0, "peak_bytes": 800 * 2**20, "kv_cache_bytes": 96 * 2**20},
              {"rank": 1, "peak_bytes": 700 * 2**20, "kv_cache_bytes": 64.5 * 2**20}]
    rows = [MeasuredPrefill("vpp", ttft=[1.0], memory=memory)]
    report(rows, {"transfer_s": 0.0, "layouts": {}, "memory_method": "peak RSS"}, BenchConfig(model="toy"),
           as_json=False, atol=1e-3)
    assert ("peak memory per rank, MiB (peak RSS), with its KV cache: vpp r0=800 (KV 96.0) r1=700 (KV 64.5)"
            in capsys.readouterr().out)


@pytest.fixture(scope="module")
def fp8_dir(fp8_case):  # fp8_case: tests/cli/conftest.py
    return fp8_case.path


def _refusal(capsys, *argv) -> str:
    """``vpp prefill`` in this process: it must stop before launching ranks, with status 2."""
    from vpp.cli import main
    assert main(["prefill", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vpp prefill: error: ") and "\n" not in err, err
    return err


def test_refusals_end_before_any_rank_starts(fp8_dir, tmp_path, capsys):
    from safetensors.torch import load_file, save_file
    weight = "model.layers.1.mlp.experts.2.up_proj.weight"
    no_scale = shutil.copytree(fp8_dir, tmp_path / "no_scale")
    tensors = load_file(str(no_scale / "model.safetensors"))
    del tensors[weight + "_scale_inv"]
    save_file(tensors, str(no_scale / "model.safetensors"))
    err = _refusal(capsys, "--model", str(no_scale), "--tp", "2")
    assert f"{no_scale / 'model.safetensors'}: {weight} is F8_E4M3 without {weight}_scale_inv" in err
    awq = shutil.copytree(fp8_dir, tmp_path / "awq")
    cfg = json.loads((awq / "config.json").read_text())
    (awq / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "awq"}}))
    assert "quant_method='awq' is not supported" in _refusal(capsys, "--model", str(awq))
    (awq / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "float64"}))
    assert "torch_dtype='float64' is not a dtype vpp runs in" in _refusal(capsys, "--model", str(awq))
    assert "unknown model 'no-such-model'" in _refusal(capsys, "--model", "no-such-model")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("the model reads")
    assert "a text prompt needs a model directory with tokenizer.json" in _refusal(
        capsys, "--model", "tiny-qwen", "--prompt-file", str(prompt))
    assert "cannot be read as a text prompt" in _refusal(capsys, "--model", fp8_dir, "--prompt-file",
                                                         str(tmp_path / "missing.txt"))


@pytest.mark.slow
def test_prefill_command_runs_every_schedule_on_an_fp8_checkpoint_and_checks_logits(fp8_case, tmp_path, capsys):
    """One run of the command checks its wiring on one family: every schedule (DCPP
    profiles the real stage and cuts shrinking chunks) on a tiny FP8 checkpoint in the official layout
    at TP 2 x PP 2, a text prompt, the config's torch_dtype, --check, --save-logits and --trace."""
    from transformers import AutoModelForCausalLM

    from vpp.models import load_tokenizer, text_prompt
    fp8_dir = fp8_case.path
    text = "the model reads each slice of its weights once and long prompts are cut into chunks"
    (tmp_path / "prompt.txt").write_text(text)
    logits_file, trace_dir = tmp_path / "logits.safetensors", tmp_path / "trace"
    schedules = ["cpp", "vpp", "vpp-async", "dcpp", "vpp-packed"]
    from vpp.cli import main
    assert main(["prefill", "--model", fp8_dir, "--check", "--tp", "2", "--pp", "2", "--seq-len", "64",
                 "--chunk-size", "16", "--repeat", "2", "--no-progress", "--json", "--schedule", ",".join(schedules),
                 "--prompt-file", str(tmp_path / "prompt.txt"), "--save-logits", str(logits_file),
                 "--trace", str(trace_dir)]) == 0, capsys.readouterr().err[-3000:]
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["dtype"] == "bfloat16" and out["config"]["seq_len"] == 64  # the config's torch_dtype
    # 8 bf16 ulps of the largest logit (see vpp/cli/prefill.py)
    assert out["atol"] == pytest.approx(2.0 ** -4 * out["check"]["reference_max_abs"])
    assert [r["schedule"] for r in out["rows"]] == schedules
    for row in out["rows"]:
        assert len(row["ttft"]["values"]) == 2 and row["ttft"]["median"] > 0
        assert 0 <= row["bubble_ratio"]["median"] < 1
        assert row["max_abs_diff"] <= out["atol"], row
    assert out["rows"][0]["speedup"]["values"] == [1.0, 1.0]
    saved = load_file(str(logits_file))
    ids = saved["input_ids"]
    assert ids.tolist() == text_prompt(load_tokenizer(fp8_dir), text, 64).tolist()
    # the saved logits against transformers' own forward on the dequantized weights (float32): the run
    # computes in bfloat16, so the same next token and within the check's tolerance (observed 0.035 of
    # 0.18; the logits of the token before, what an off-by-one saves, differ by 2.8)
    ref = AutoModelForCausalLM.from_pretrained(fp8_case.dequantized_path).eval()(ids[None]).logits[0, -1]
    for schedule in schedules:
        got = saved[f"logits.{schedule}"].float().reshape(-1)
        assert int(got.argmax()) == int(ref.argmax()), schedule
        torch.testing.assert_close(got, ref, atol=out["atol"], rtol=0, msg=schedule)
    written = {p.name for p in trace_dir.iterdir()}
    assert {"vpp.trace.json", "vpp.chrome.json", "vpp.png", "cpp.simulated.png", "dcpp.png"} <= written, written


def test_the_why_line_names_the_ratio_per_round_and_the_bubbles(capsys):
    """TTFT of the fastest V schedule over CPP's, round by round (here 0.9, 0.95, 0.92: median 0.92), the
    median bubbles, and the layers that run alone at the end (the V's last stage vs CPP's last rank)."""
    from vpp.cli.prefill import why_line
    rows = [MeasuredPrefill("cpp", ttft=[10.0, 10.0, 10.0], bubble_ratio=[0.17, 0.18, 0.16]),
            MeasuredPrefill("vpp", ttft=[9.8, 9.9, 9.7], bubble_ratio=[0.13] * 3),
            MeasuredPrefill("vpp-async", ttft=[9.0, 9.5, 9.2], bubble_ratio=[0.09, 0.10, 0.08])]
    facts = {"partitions": {"cpp": [3, 3], "vpp": [1, 1, 2, 2], "vpp-async": [2, 1, 2, 1]}}
    line = why_line(rows, facts)
    assert line == ("why VPP-Async is faster: TTFT 0.920 x CPP's [0.900-0.950] (per round); it left 9.0% of the "
                    "ranks' time idle (bubble) vs CPP's 17.0%; the last chunk ends on one rank alone, 1 layer "
                    "(the V's last stage) vs CPP's 3")
    rows[2].ttft[1] = 10.5
    rows[1].ttft = [10.1] * 3
    assert why_line(rows, {}).startswith("why VPP-Async is not faster every round: TTFT 0.920 x CPP's [0.900-1.050]")
    assert why_line(rows[1:], facts) is None            # no CPP to compare with
    report(rows, {"transfer_s": 0.0, "layouts": {}, **facts}, BenchConfig(model="toy"), as_json=False, atol=1e-3)
    assert "why VPP-Async is not faster every round" in capsys.readouterr().out
