"""Prompts given on several ranks must agree (a digest in the prompts' exchange); empty prompts are refused
on every rank; the CLI refuses an empty prompt file before any rank starts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from vpp.runtime.handshake import disagreement, prompts_digest


@dataclass
class _Info:
    global_rank: int
    prompt_lengths: tuple | None
    prompt_digest: str | None


def test_digest_and_disagreement():
    a, b = torch.arange(10), torch.arange(10).flip(0)
    assert prompts_digest([a]) == prompts_digest([a.clone().to(torch.int32)])  # the ids, not the dtype
    assert prompts_digest([a]) != prompts_digest([b])  # same length, same values, another order
    assert prompts_digest([a[:5], a[5:]]) != prompts_digest([a])  # split differently
    same = [_Info(0, (10,), prompts_digest([a])), _Info(1, None, None), _Info(2, None, prompts_digest([a]))]
    assert disagreement(same) is None
    differ = [_Info(0, (10,), prompts_digest([a])), _Info(1, None, prompts_digest([b])), _Info(2, (10,), prompts_digest([a]))]
    assert disagreement(differ) == ("ranks were given different prompts: global rank(s) [0, 2] (lengths [10]) vs "
                                    "global rank(s) [1]; give every rank the same prompts, or None on the ranks "
                                    "that do not hold stage 0")


def _spawned(rank, world):
    from vpp.models import build_stage, model_config, random_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.parallel import initialize_model_parallel
    from vpp.schedules.layout import make_layout
    from vpp.runtime import Pipeline

    groups = initialize_model_parallel(1, 2)
    config = model_config(TINY_CONFIGS["tiny-deepseek"])
    layout = make_layout("v", 6, 2)
    stages = [build_stage(config, layout.stage_layers[s], groups, weights=random_checkpoint(config, seed=0))
              for s in layout.stages_of(groups.pp.rank)]
    pipe = Pipeline(stages, groups, timeout_s=60)
    ids = torch.arange(20) % 50
    out = {}
    for name, mine in {"differ": ids if rank == 0 else ids + 1,      # the second rank's would be ignored
                       "shorter": ids if rank == 0 else ids[:-1],
                       "empty": torch.zeros(0, dtype=torch.long) if rank == 0 else None,
                       "empty on rank 1": ids if rank == 0 else torch.zeros(0, dtype=torch.long)}.items():
        try:
            pipe.prefill(mine, 8)
            out[name] = "ran"
        except ValueError as exc:
            out[name] = str(exc)
    same = pipe.prefill(ids, 8)  # every rank given the same prompt: runs
    out["same"] = None if same.logits is None else int(same.logits.argmax())
    pipe.release(0)
    return out


@pytest.mark.slow
def test_every_rank_raises_on_disagreeing_prompts(worlds):
    outs = worlds.run(2, _spawned, timeout=240)
    a, b = outs
    for key in ("differ", "shorter", "empty", "empty on rank 1"):
        assert a[key] == b[key], key  # the same error on every rank
    assert a["differ"].startswith("ranks were given different prompts: global rank(s) [0] (lengths [20]) vs "
                                  "global rank(s) [1]")
    assert "global rank(s) [0] (lengths [20]) vs global rank(s) [1]" in a["shorter"]
    assert a["empty"] == "prompt is empty"
    assert a["empty on rank 1"].startswith("ranks were given different prompts")
    assert a["same"] is not None  # rank 0 holds the last stage of the V


def test_cli_refuses_an_empty_prompt_file(tmp_path, capsys):
    from tests.models.fp8_tiny import save_tokenizer
    from vpp import cli
    from vpp.models import model_config, random_checkpoint
    from vpp.models.build import save_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    config = model_config(TINY_CONFIGS["tiny-deepseek"])
    save_checkpoint(config, random_checkpoint(config, seed=0), tmp_path / "m")
    save_tokenizer(tmp_path / "m")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    for argv in (["prefill", "--model", str(tmp_path / "m"), "--prompt-file", str(empty)],
                 ["generate", "--model", str(tmp_path / "m"), "--prompt-file", str(empty)],
                 ["generate", "--model", str(tmp_path / "m"), "--prompt", ""]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"vpp {argv[0]}: error: ") and "empty" in err[0], err


@dataclass
class _Call:
    global_rank: int
    call: tuple


def test_call_signature_and_disagreement():
    from vpp.runtime.inputs import call_disagreement, call_signature
    import numpy as np
    a = call_signature(schedule="vpp", chunk_size=8, request_ids=None)
    assert a == call_signature(schedule="vpp", chunk_size=np.int64(8), request_ids=None)  # numpy ints alike
    assert call_signature(chunk_size=lambda n: [n]) == (("chunk_size", "function test_call_signature_and_disagreement"
                                                                         ".<locals>.<lambda>"),)
    long = call_signature(chunk_size=[[8] * 100])[0][1]
    assert len(long) < 100 and long != call_signature(chunk_size=[[8] * 99 + [9]])[0][1]
    infos = [_Call(0, a), _Call(1, a), _Call(2, call_signature(schedule="vpp", chunk_size=16, request_ids=None))]
    assert call_disagreement(infos[:2]) is None
    assert call_disagreement(infos) == ("ranks were given different chunk_size: global rank 0 has 8, global rank 2 "
                                        "has 16; every rank must make the same call")


def _toy_pipe(rank):
    from vpp.models.toy import ToyStage
    from vpp.parallel import initialize_model_parallel
    from vpp.runtime import Pipeline
    groups = initialize_model_parallel(1, 2)  # a V over 2 ranks: rank 0 holds [0, 1) and [3, 4)
    ranges = [(0, 1), (3, 4)] if rank == 0 else [(1, 3)]
    return Pipeline([ToyStage(r, 4, vocab_size=64) for r in ranges], groups, timeout_s=60)


def _misuse(rank, world):
    pipe = _toy_pipe(rank)
    ids = torch.arange(32) % 64
    mine = ids if rank == 0 else None
    out = {}
    for name, kw in {"chunk_size": dict(chunk_size=8 if rank == 0 else 16),  # gloo aborted rank 0 (SIGABRT)
                     "schedule": dict(schedule="vpp" if rank == 0 else "vpp-async"),   # ran, silently
                     "request_ids": dict(request_ids=[rank]),                 # ran: caches under 0 and 1
                     # the stream arguments: each would build another plan (or gate) on one rank
                     "arrivals": dict(arrivals=[0.0] if rank == 0 else [0.5]),
                     "concurrency": dict(concurrency=1 + rank),
                     "cached_tokens": dict(cached_tokens=4 * rank),
                     "steps": dict(steps=[[(0, c)] for c in range(4)] if rank == 0 else None)}.items():
        try:
            pipe.prefill(mine, **{"chunk_size": 8, **kw})
            out[name] = "ran"
        except ValueError as exc:
            out[name] = str(exc)
    pipe.prefill(mine, 8)
    try:  # the stage-0 rank sees it; every rank refuses it, and request 0 keeps its caches
        pipe.prefill(mine, 8)
        out["again"] = "ran"
    except ValueError as exc:
        out["again"] = str(exc)
    out["kept"] = [st.cache_length(0) for st in pipe.stages]
    if rank == 1:
        pipe.release(0)  # only here: the next decode must fail on both ranks, naming rank 1
    try:
        pipe.decode(torch.tensor([1]), [0])
        out["decode"] = "ran"
    except Exception as exc:
        out["decode"] = f"{type(exc).__name__}: {exc}"
    return out


@pytest.mark.slow
def test_every_rank_refuses_disagreeing_arguments_and_misuse():
    from vpp.parallel import run_distributed
    a, b = run_distributed(_misuse, 2, timeout=240)
    for name, shown in (("chunk_size", "global rank 0 has 8, global rank 1 has 16"),
                        ("schedule", "global rank 0 has 'vpp', global rank 1 has 'vpp-async'"),
                        ("request_ids", "global rank 0 has [0], global rank 1 has [1]"),
                        ("arrivals", "global rank 0 has [0.0], global rank 1 has [0.5]"),
                        ("concurrency", "global rank 0 has 1, global rank 1 has 2"),
                        ("cached_tokens", "global rank 0 has 0, global rank 1 has 4"),
                        ("steps", "global rank 0 has [[[0, 0]], [[0, 1]], [[0, 2]], [[0, 3]]], global rank 1 has None")):
        assert a[name] == b[name] == f"ranks were given different {name}: {shown}; every rank must make the same call"
    assert a["again"] == b["again"] and a["again"].startswith("request 0 already holds 32 tokens in the caches of "
                                                              "stage [0, 1] on global rank 0")
    assert a["kept"] == [32, 32] and b["kept"] == [32]
    assert b["decode"].startswith("ValueError: request 0 holds no caches on stage [1, 3] (global rank 1)")
    assert a["decode"].startswith("ExecutionError: ") and "pipeline rank 1 (global rank 1) raised ValueError: " \
        "request 0 holds no caches" in a["decode"]
