"""Every schedule at CP x PP, against transformers (tiny random 6-layer models, fp32, rel 1e-5 as
tests/models/test_cp_pipeline_parity.py): at CP2 x PP2 (the session's world of 4 ranks) VPP-packed
over three requests (GQA and MLA), steps shared by the three requests under one token budget (CPP and
VPP-Async; pieces as short as 2 tokens, fewer than the 2 x cp pieces a chunk is cut into), and uneven
partitions (a loop [1, 5], a V [1, 3, 1, 1]); at CP2 x PP3 (the world of 6 ranks) CPP, VPP-Async and
VPP-packed; there a deliberately permuted mapping (each CP rank's rows sent to the other CP rank of
the next stage) moves the logits far past the tolerance. Each request's last-token logits are checked
on both CP ranks of the pipeline rank that holds the last stage (the one holding the last token
broadcasts them); every other rank returns none.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow  # one case per world size, on the session's worlds

REL = 1e-5
CP = 2
LAYERS = 6
PP2 = [  # (name, model type, layout kind, partition, schedule, chunking)
    ("packed-gqa", "qwen3_moe", "v", None, "vpp-packed", 8),
    ("packed-mla", "deepseek_v3", "v", None, "vpp-packed", 8),
    ("shared-cpp", "qwen3_moe", "loop", None, "cpp", "shared"),
    ("shared-vpp-async", "deepseek_v3", "v", None, "vpp-async", "shared"),
    ("uneven-loop", "qwen3_moe", "loop", [1, 5], "cpp", 16),
    ("uneven-v", "deepseek_v3", "v", [1, 3, 1, 1], "vpp-async", 8),
]
PP3 = [
    ("pp3-cpp", "qwen3_moe", "loop", None, "cpp", 16),
    ("pp3-vpp-async", "deepseek_v3", "v", None, "vpp-async", 8),
    ("pp3-packed", "qwen3_moe", "v", None, "vpp-packed", 8),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """model type -> (path, prompts a, b, a[:23], transformers' last-token logits of each)."""
    from tests.models.cp_pp_schedules import LENGTHS
    from tests.models.hf_tiny import VOCAB, model
    root = tmp_path_factory.mktemp("cp-pp-6")
    g = torch.Generator().manual_seed(2)
    a, b = torch.randint(0, VOCAB, (LENGTHS[0],), generator=g), torch.randint(0, VOCAB, (LENGTHS[1],), generator=g)
    prompts = [a, b, a[:LENGTHS[2]]]
    out = {}
    for t in ("qwen3_moe", "deepseek_v3"):
        m = model(t, num_hidden_layers=LAYERS)
        m.save_pretrained(root / t)
        with torch.no_grad():
            logits = m(a[None]).logits[0]
            refs = [logits[-1], m(b[None]).logits[0, -1], logits[LENGTHS[2] - 1], logits[31]]
        out[t] = (str(root / t), prompts, refs)
    return out


def _world(worlds, models, size, cases, permuted_case=None):
    from tests.models.cp_pp_schedules import run_schedules_world
    paths = {t: v[0] for t, v in models.items()}
    return worlds.run(size, run_schedules_world, paths, {t: v[1] for t, v in models.items()},
                      {t: v[2] for t, v in models.items()}, cases, permuted_case, timeout=600)


@pytest.fixture(scope="module")
def pp2(worlds, models):
    return _world(worlds, models, 4, PP2)


@pytest.fixture(scope="module")
def pp3(worlds, models):
    return _world(worlds, models, 6, PP3, permuted_case=("qwen3_moe", "loop"))


def _check(results, name, kind, pp):
    last = pp - 1 if kind == "loop" else 0  # the pipeline rank holding the last stage
    for rank, res in enumerate(results):
        errors = res[name]
        if res["pp_rank"] == last:
            assert errors is not None and len(errors) == 3, (rank, name, errors)
            assert max(errors) <= REL, f"rank {rank}, {name}: rel errors per request {errors}"
        else:
            assert errors is None, f"rank {rank} holds no last stage but returned logits for {name}"


@pytest.mark.parametrize("case", PP2, ids=lambda c: c[0])
def test_cp2_pp2_matches_transformers(case, pp2):
    name, _, kind, _, _, _ = case
    _check(pp2, name, kind, 2)
    if name == "shared-cpp":  # steps really shared, with pieces shorter than 2 x cp tokens
        steps = pp2[0]["steps"]
        assert any(len(s) > 1 for s in steps)


@pytest.mark.parametrize("case", PP3, ids=lambda c: c[0])
def test_cp2_pp3_matches_transformers(case, pp3):
    assert sorted(r["pp_rank"] for r in pp3) == [0, 0, 1, 1, 2, 2]
    _check(pp3, case[0], case[2], 3)


def test_cp2_pp3_rows_sent_to_the_wrong_cp_rank_are_caught(pp3):
    """CPP on a deliberately permuted mapping (pipeline rank j of pipeline c on CP rank (c + j) mod 2:
    every hop lands on the other CP rank) ends with logits far off: the checks above would see it."""
    assert [r["permuted_ranks"] for r in pp3] == [(0, 3, 4), (1, 2, 5), (1, 2, 5), (0, 3, 4), (0, 3, 4), (1, 2, 5)]
    errors = [r["permuted"] for r in pp3 if r["pp_rank"] == 2]
    assert len(errors) == 2 and all(e[0] > 100 * REL for e in errors), errors
