"""``vpp tune`` prints, for each row, the command that runs its deployment, and the runtime runs every
one: each distinct (cp, tp, pp, schedule, folds, layout) the tuner can recommend (its whole candidate
space on a GQA and an MLA model: CP alone, VPP-Async x CP, the loop, the V and the interleaved layout),
and a tapered row, scaled down to tiny-qwen (8 layers) on at most 4 ranks, passes ``vpp prefill``'s
checks (the split over the grid built on the meta device, the memory plan) in this process, then runs
on the session's worlds through the command's own per-rank job with ``--check``. The tuner's top
VPP-Async x CP row also runs as printed (scaled) under torchrun (tests/cli/test_cp_cli.py)."""

from __future__ import annotations

import re
import shlex

import pytest

from vpp.cli import build_parser
from vpp.cli import prefill
from vpp.cli.tune import command, deployment
from vpp.perf.deployment_search import candidates
from vpp.perf.hardware import get_device
from vpp.perf.runs import paper_setup

LENGTH = 524288


def _setups():
    device = get_device("910c")
    return [paper_setup(m, device, tp=8, pp=2) for m in ("qwen3-coder-30b-a3b", "deepseek-v3.1")]


def _rows():
    return [(c, s) for s in _setups() for c in candidates(s, max_folds=2)]


def _parse(line: str):
    words = shlex.split(line)
    assert words[:2] == ["torchrun", "--nproc-per-node"] and words[3:6] == ["-m", "vpp", "prefill"], line
    return int(words[2]), build_parser("prefill").parse_args(words[5:])


def test_every_row_prints_the_command_of_its_deployment():
    rows = _rows()
    assert any(c.cp > 1 and (c.pp or 2) > 1 for c, _ in rows)  # VPP-Async x CP rows are among them
    assert any(c.kind == "interleaved" for c, _ in rows)
    for cand, setup in rows:
        line, d = command(cand, setup, LENGTH), deployment(cand, setup)
        ranks, args = _parse(line)
        assert ranks == setup.devices == args.cp * args.tp * args.pp  # the tuner's devices, regrouped
        assert (args.cp, args.tp, args.pp, args.seq_len, args.chunk_size) == (
            d["cp"], d["tp"], d["pp"], LENGTH, cand.chunk)
        if args.pp > 1:
            assert (args.schedule, args.folds, args.layout) == (d["schedule"], d["folds"], d["layout"])
            assert (args.layout == "interleaved") == (cand.kind == "interleaved")


def test_a_tapered_row_runs_the_chunk_sizes_the_tuner_simulated():
    """Every ramp of the taper family: the printed --taper-head/--taper-tail cut the prompt into the very
    sizes the tuner evaluated (vpp prefill hands them to vpp.perf.taper.tapered_chunking)."""
    from vpp.perf.deployment_search import Candidate
    from vpp.perf.taper import HEADS, TAILS, tapered_chunking, tapered_sizes
    setup = _setups()[0]
    for head in HEADS:
        for tail in TAILS:
            sizes = tapered_sizes(LENGTH, 16384, head, tail)
            cand = Candidate("v", 1, "even", 16384, "async", f"taper head={head} tail={tail}", tuple(sizes),
                             head=head, tail=tail)
            _, args = _parse(command(cand, setup, LENGTH))
            assert (args.taper_head, args.taper_tail) == (head, tail)
            assert tapered_chunking(args.chunk_size, args.taper_head, args.taper_tail)(args.seq_len) == sizes


def _scaled() -> list[dict]:
    """Each distinct (cp, tp, pp, schedule, folds, layout) of the rows, with its printed command and the
    sizes scaled to at most 4 ranks."""
    out = {}
    for cand, setup in _rows():
        d = deployment(cand, setup)
        cp, pp = min(d["cp"], 2), min(d["pp"], 2)
        key = (d["cp"], d["tp"], d["pp"], d["schedule"], d["folds"], d["layout"])
        out[key] = dict(cp=cp, tp=min(d["tp"], 4 // (cp * pp), 2), pp=pp, schedule=d["schedule"], folds=d["folds"],
                        layout=d["layout"], line=command(cand, setup, LENGTH))
    return list(out.values())


SCALED = _scaled()


@pytest.fixture(scope="module")
def tiny_qwen_8(tmp_path_factory):
    """tiny-qwen with 8 layers (a V of 2 folds on 2 ranks has 8 stages), as a model directory."""
    from vpp.models import model_config, random_checkpoint, save_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    cfg = model_config(dict(TINY_CONFIGS["tiny-qwen"], num_hidden_layers=8))
    path = tmp_path_factory.mktemp("tune") / "tiny-qwen-8"
    save_checkpoint(cfg, random_checkpoint(cfg, seed=0), str(path))
    return str(path)


def _scaled_args(line: str, model: str, cp: int, tp: int, pp: int, *, seq_len: int = 64, chunk: int = 16,
                 schedule: str | None = None, extra=()):
    """``vpp prefill``'s parsed arguments of a printed command (the words after "-m vpp"), its sizes scaled
    down: the model, --cp/--tp/--pp, the prompt and the chunk (``schedule``: several schedules in one run)."""
    words = shlex.split(line)[5:]
    scaled = {"--model": model, "--cp": cp, "--tp": tp, "--pp": pp, "--seq-len": seq_len, "--chunk-size": chunk}
    if schedule:
        scaled["--schedule"] = schedule
    argv = [str(scaled.get(words[i - 1], w)) if i else w for i, w in enumerate(words)] + ["--device", "cpu", *extra]
    return build_parser("prefill").parse_args(argv)


@pytest.mark.parametrize("d", SCALED, ids=lambda d: "cp{cp}-tp{tp}-pp{pp}-{schedule}-f{folds}-{layout}".format(**d))
def test_every_distinct_deployment_scaled_down_passes_the_runtime_checks(d, tiny_qwen_8):
    args = _scaled_args(d["line"], tiny_qwen_8, d["cp"], d["tp"], d["pp"])
    prefill.check(args)  # raises UsageError (one line) on anything the runtime would refuse
    assert args.cp * args.tp * args.pp <= 4 and (args.pp == 1 or args.schedule == d["schedule"])


def _runs() -> list[dict]:
    """The scaled deployments as runs: the rows that differ only in their schedule run as one ``vpp
    prefill --schedule a,b`` (each schedule checked on its own), plus one tapered row (512 tokens in
    chunks of 128, so that its ramps cut 64-token pieces)."""
    from vpp.perf.deployment_search import Candidate
    from vpp.perf.taper import tapered_sizes
    out = {}
    for d in SCALED:
        words = shlex.split(d["line"])
        key = (d["cp"], d["tp"], d["pp"], d["folds"], d["layout"], words[words.index("--partition") + 1]
               if "--partition" in words else None)
        run = out.setdefault(key, dict(d, schedules=[], seq_len=64, chunk=16))
        if d["schedule"] not in run["schedules"]:
            run["schedules"].append(d["schedule"])
    setup, head, tail = _setups()[0], (0.25, 0.75), (0.5, 0.25, 0.25)
    taper = Candidate("v", 1, "even", 16384, "async", f"taper head={head} tail={tail}",
                      tuple(tapered_sizes(LENGTH, 16384, head, tail)), head=head, tail=tail)
    runs = list(out.values()) + [dict(cp=1, tp=2, pp=2, schedules=["vpp-async"], folds=1, layout=None, seq_len=512,
                                      chunk=128, line=command(taper, setup, LENGTH))]
    for r in runs:
        r["id"] = "cp{cp}-tp{tp}-pp{pp}-f{folds}-{layout}-{n}".format(n=len(r["schedules"]), **r) + (
            "-taper" if "--taper-head" in r["line"] else "")
    return runs


RUNS = _runs()


@pytest.mark.slow  # on the session's worlds of 4 (and 2) ranks
@pytest.mark.parametrize("run", RUNS, ids=lambda r: r["id"])
def test_every_distinct_deployment_scaled_down_runs_and_matches_the_reference(run, tiny_qwen_8, worlds, capsys):
    """The scaled command, checked as ``vpp prefill`` checks it, then run on a persistent world through
    the command's own per-rank job (:func:`vpp.cli.prefill.rank_job`; ``--no-pin``: the world's ranks serve
    later cases) and reported by :func:`vpp.cli.prefill.finish`: exit status 0 with ``--check``,
    every schedule's last-token logits within 1e-3 of the unpipelined forward (fp32)."""
    import json
    args = _scaled_args(run["line"], tiny_qwen_8, run["cp"], run["tp"], run["pp"], seq_len=run["seq_len"],
                        chunk=run["chunk"], schedule=",".join(run["schedules"]) if run["pp"] > 1 else None,
                        extra=("--check", "--repeat", "1", "--no-warmup", "--no-progress", "--json", "--no-pin"))
    prefill.check(args)
    fn, ranks, job = prefill.rank_job(args)
    assert getattr(job, "pin", False) is False  # --no-pin reaches the pipeline's job (CP alone never pins)
    assert ranks == run["cp"] * run["tp"] * run["pp"] <= 4
    out = worlds.run(ranks, fn, job, timeout=300)[0]
    assert prefill.finish(args, job, out) == 0
    printed = json.loads(capsys.readouterr().out)
    if args.pp == 1:
        assert printed["config"]["cp"] == 2 and printed["max_abs_diff"] <= 1e-3
        return
    assert [r["schedule"] for r in printed["rows"]] == run["schedules"]
    for s in run["schedules"]:
        assert printed["check"][s] <= 1e-3, (s, printed["check"])
        assert printed["layouts"][s].startswith(
            "loop" if s in ("cpp", "dcpp") else run["layout"] or "v"), printed["layouts"][s]
    if "--taper-head" in run["line"]:  # the ramps really cut the prompt
        assert printed["chunks"]["vpp-async"] == [64, 64, 128, 64, 64, 64, 64]


@pytest.mark.parametrize("argv,pattern", [
    (["--layout", "interleaved"], r"cpp runs a loop layout, not 'interleaved' \(the interleaved layout takes the V"),
    (["--schedule", "dcpp", "--taper-head", "0.5,0.5"], r"dcpp takes its chunk sizes from its planner"),
    (["--schedule", "vpp", "--taper-tail", "0.5", "--chunk-size", "32"], r"pieces of at least 64 tokens"),
    (["--cp", "2", "--pp", "1", "--taper-head", "0.5"], r"--taper-head cannot be combined with --cp 2 --pp 1"),
])
def test_layouts_and_tapers_no_schedule_runs_are_one_line_errors(capsys, argv, pattern):
    from vpp import cli
    assert cli.main(["prefill", "--model", "tiny-qwen", "--seq-len", "256", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vpp prefill: error: "), err
    assert re.search(pattern, err[0]), err[0]
