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
    from vpp.plan.layout import make_layout
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
def test_every_rank_raises_on_disagreeing_prompts():
    from vpp.parallel import run_distributed
    outs = run_distributed(_spawned, 2, timeout=240)
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
