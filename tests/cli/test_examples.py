"""The example scripts run as a model author would run them (spawned CPU ranks, tiny models), each as
its own process; ``vpp generate`` runs in this process (``vpp.cli.main``: the same argument parsing, checks
and spawned ranks, without an interpreter and torch import of its own), and under torchrun as a process."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every test here starts processes

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(*args):
    # a script's own directory comes first on its sys.path, not the cwd: point it at this checkout's vpp
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _vpp(capsys, *argv) -> str:
    """``vpp ARGV`` in this process (its ranks spawned as the command spawns them): what it printed."""
    from vpp import cli
    assert cli.main(list(argv)) == 0, capsys.readouterr().err[-3000:]
    return capsys.readouterr().out


def test_glm_example_prints_the_first_token():
    """(deepseek_prefill.py runs below, on an FP8 checkpoint against transformers' next token.)"""
    out = _run("examples/glm_prefill.py", "--seq-len", "384", "--chunk-size", "128")
    assert re.search(r"first generated token: \d+", out), out


def test_qwen_example_cpp_and_vpp_agree():
    out = _run("examples/qwen_prefill.py", "--seq-len", "256", "--chunk-size", "64")
    tokens = re.findall(r"(cpp|vpp): first token (\d+)", out)
    assert [t[0] for t in tokens] == ["cpp", "vpp"] and tokens[0][1] == tokens[1][1], out


def test_pp_sweep_rows_agree_on_the_first_token():
    out = _run("examples/pp_sweep.py", "--seq-len", "64", "--chunk-size", "16", "--pp", "1,2")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if re.match(r"\| [12] \|", line)]
    assert len(rows) == 10  # 5 variants x 2 degrees: a variant that cannot run is a row that says why
    ran = [r for r in rows if not r[-1].strip().startswith("skipped")]
    assert len(ran) >= 6
    assert len({r[-1].strip() for r in ran}) == 1, out
    assert "skipped: one rank holds every stage" in out


def test_pp_sweep_under_torchrun_prints_one_table():
    """Under torchrun every rank runs the script: one (pipeline rank 0) prints the table, the others end
    with exit 0 (they raised StopIteration and printed the header too)."""
    out = _run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "examples/pp_sweep.py",
               "--seq-len", "64", "--chunk-size", "16")
    assert out.count("| PP | schedule |") == 1, out
    rows = [line for line in out.splitlines() if re.match(r"\| 2 \|", line)]
    assert len(rows) == 5, out  # the 5 variants at PP = world size, once


def test_generate_example_decodes_two_prompts():
    out = _run("examples/generate.py", "--seq-len", "96", "--chunk-size", "32", "--max-new-tokens", "4")
    rows = re.findall(r"prompt (\d) \((\d+) tokens\): \[([\d, ]+)\]", out)
    assert [(r[0], r[1]) for r in rows] == [("0", "96"), ("1", "48")], out
    assert all(len(r[2].split(",")) == 4 for r in rows), out


GENERATE = ["generate", "--seq-len", "48", "--chunk-size", "16", "--max-new-tokens", "4", "--json", "--schedule", "vpp"]


@pytest.fixture(scope="module")
def generated():
    """`vpp generate --json` on spawned ranks, once (in this process): read by the two tests below."""
    import contextlib
    import io
    import json

    from vpp import cli
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert cli.main(GENERATE) == 0
    return json.loads(out.getvalue())


def test_generate_command_json(generated):
    d = generated
    assert len(d["prompt_ids"]) == 48 and len(d["generated_ids"]) == 4 and d["ttft_s"] > 0
    assert d["time_per_output_token_s"] > 0


def test_example_runs_an_fp8_checkpoint_on_a_text_prompt(fp8_case, tmp_path):
    case = fp8_case  # tests/cli/conftest.py
    (tmp_path / "prompt.txt").write_text("ranks stay busy when stages fold back in a V")
    out = _run("examples/deepseek_prefill.py", "--model", case.path, "--prompt-file", str(tmp_path / "prompt.txt"),
               "--seq-len", "40", "--chunk-size", "16", "--dtype", "float32")
    # float32, whole prompt at once: the same next token as transformers on the dequantized weights
    from transformers import AutoModelForCausalLM
    from vpp.models import load_tokenizer, text_prompt
    ids = text_prompt(load_tokenizer(case.path), "ranks stay busy when stages fold back in a V", 40)
    ref = AutoModelForCausalLM.from_pretrained(case.dequantized_path).eval()(ids[None]).logits[0, -1]
    assert re.search(rf"first generated token: {int(ref.argmax())};", out), out


def test_generate_under_torchrun_streams_the_tokens_of_spawned_ranks(generated):
    """Under torchrun, without --json and on CPP: global rank 0 alone streams the ids, the same greedy
    tokens as the spawned ranks' VPP run (the same seeded prompt)."""
    streamed = _run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "vpp",
                    *[a for a in GENERATE if a not in ("--json", "vpp")], "cpp")
    assert streamed.split() == [str(t) for t in generated["generated_ids"]], streamed


def test_generate_decodes_on_another_group_and_from_a_kv_directory(tmp_path, capsys):
    """`vpp generate --decode-tp 2` after a TP1 x PP2 vpp-async prefill, and the directory round trip
    (--save-kv on CP2 x PP2, each CP rank writing its token shard, --load-kv on TP2 x PP1), against
    transformers' greedy generate (DeepSeek-V3.2: MLA latents and DSA indexer keys; tests/kv/test_handover.py
    and test_cp_handover.py cover the families and layouts through the API)."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from tests.models.hf_tiny import model
    path = tmp_path / "m"
    model("deepseek_v32", num_hidden_layers=6).save_pretrained(path)
    common = ["--model", str(path), "--max-new-tokens", "12", "--json", "--chunk-size", "8"]
    moved = json.loads(_vpp(capsys, "generate", *common, "--seq-len", "37", "--tp", "1", "--pp", "2",
                            "--schedule", "vpp-async", "--decode-tp", "2"))
    saved = json.loads(_vpp(capsys, "generate", *common, "--seq-len", "37", "--cp", "2", "--pp", "2",
                            "--schedule", "vpp-async", "--save-kv", str(tmp_path / "kv")))
    assert json.loads((tmp_path / "kv" / "manifest.json").read_text())["writer"]["cp"] == 2
    loaded = json.loads(_vpp(capsys, "generate", *common, "--tp", "2", "--pp", "1", "--load-kv",
                             str(tmp_path / "kv")))
    ids = torch.tensor(moved["prompt_ids"])
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(path).eval().generate(
            ids[None], attention_mask=torch.ones_like(ids)[None], max_new_tokens=12, do_sample=False,
            pad_token_id=0, eos_token_id=None)[0, ids.numel():].tolist()
    assert moved["generated_ids"] == ref and moved["handover_s"] > 0
    assert saved["generated_ids"] == ref[:1] and loaded["prompt_ids"] == moved["prompt_ids"]
    assert loaded["generated_ids"] == ref


def _own_model_matches(out: str) -> None:
    diffs = dict(re.findall(r"(vpp-async|cpp): max \|logits - unpipelined\| (\S+)", out))
    assert sorted(diffs) == ["cpp", "vpp-async"] and all(float(d) < 1e-5 for d in diffs.values()), out
    tokens = re.search(r"Pipeline tokens (\[[\d, ]+\]), unpipelined (\[[\d, ]+\])", out)
    assert tokens and tokens.group(1) == tokens.group(2), out


def test_own_model_example_matches_its_unpipelined_forward_spawned():
    """A model author's own blocks (RoPE, gated MLP, pre-norm) at PP2: VPP-Async and CPP logits, and
    Pipeline's greedy tokens, as the model's own forward gives them."""
    _own_model_matches(_run("examples/own_model.py"))


def test_own_model_example_matches_its_unpipelined_forward_under_torchrun():
    _own_model_matches(_run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                            "examples/own_model.py"))
