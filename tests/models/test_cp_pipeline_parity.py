"""Context parallelism inside the pipeline (CP2 x PP2, 4 gloo ranks of the session's world) against
transformers (tiny random models, fp32; tests/models/cp_pp_checks.py runs every case in one call).

Each stage runs on a CP group of 2 ranks; a pipeline transfer goes from each CP rank to the matching
CP rank of the next stage, carrying that rank's rows of the chunk only. Every family (qwen3_moe: GQA;
deepseek_v3: MLA; deepseek_v32 and glm_moe_dsa: DSA with index_topk 8) through CPP, VPP and
VPP-Async (and DCPP's shrinking chunks for two families): the last-token logits within rel 1e-5 of
transformers' full forward on both CP ranks of the pipeline rank holding the last stage (the CP rank
holding the last token broadcasts them), every stage's KV cache split over its CP ranks (no rank holds
a full copy), greedy decoding over the sharded caches equal to transformers' ``generate``, a
3-request stream with a cached prefix; and a permuted mapping (each CP rank's rows sent to the other
CP rank of the next stage) moves the logits far past the tolerance.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.models.cp_pp_checks import DCPP_FAMILIES, STREAM_FAMILIES
from tests.models.hf_tiny import MODEL_TYPES

pytestmark = pytest.mark.slow  # one case on the session's world of 4 ranks

REL = 1e-5
GREEDY_STEPS = 4
LAST = {"cpp": 1, "dcpp": 1, "vpp": 0, "vpp-async": 0}  # the pipeline rank holding the last stage
CP = 2


@pytest.fixture(scope="module")
def families(hf_cases, tmp_path_factory):
    """model type -> layout kind -> (case, partition): GLM-5's V runs a model with an indexer per layer
    (its layer 2 reuses layer 1's top-k, so no stage may start there; see cp_pp_checks)."""
    from tests.models.hf_tiny import model
    glm = model("glm_moe_dsa", index_topk_freq=1)
    path = tmp_path_factory.mktemp("glm-own-indexers") / "glm_moe_dsa"
    glm.save_pretrained(path)
    base = hf_cases["glm_moe_dsa"]
    with torch.no_grad():
        logits = {name: glm(ids[None]).logits[0] for name, ids in base.prompts.items()}
    own = dataclasses.replace(base, path=str(path), logits=logits)
    out = {t: {"loop": (case, None), "v": (case, None)} for t, case in hf_cases.items()}
    out["glm_moe_dsa"] = {"loop": (base, [1, 3]), "v": (own, None)}
    return out


@pytest.fixture(scope="module")
def results(families, worlds):
    from tests.models.cp_pp_checks import run_cp_pp_world
    return worlds.run(4, run_cp_pp_world, families, GREEDY_STEPS, timeout=900)


@pytest.fixture(scope="module")
def hf_greedy(hf_cases):
    """Greedy tokens of transformers' ``generate`` on the model each V ran (GLM-5: its own indexers)."""
    from tests.models.hf_tiny import model
    out = {}
    for t, case in hf_cases.items():
        kw = {"index_topk_freq": 1} if t == "glm_moe_dsa" else {}
        with torch.no_grad():
            ids = model(t, **kw).generate(case.prompts["a"][None], max_new_tokens=GREEDY_STEPS, do_sample=False)
        out[t] = ids[0, len(case.prompts["a"]):].tolist()
    return out


def _check_logits(results, key, pp_last):
    for rank, res in enumerate(results):
        error = res[key]
        if rank // CP == pp_last:  # global rank = cp_rank + cp * pp_rank (tp = 1)
            assert error is not None and error <= REL, f"rank {rank}, {key}: rel error {error}"
        else:
            assert error is None, f"rank {rank} holds no last stage but returned logits for {key}"


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("schedule", ["cpp", "vpp", "vpp-async"])
def test_cp2_pp2_matches_transformers(model_type, schedule, results):
    _check_logits(results, (model_type, "logits", schedule), LAST[schedule])


@pytest.mark.parametrize("model_type", DCPP_FAMILIES)
def test_cp2_pp2_dcpp_matches_transformers(model_type, results):
    _check_logits(results, (model_type, "logits", "dcpp"), LAST["dcpp"])


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_stage_keeps_only_its_cp_ranks_share(model_type, results, hf_cases):
    tokens = len(hf_cases[model_type].prompts["a"])  # 37: 18 and 19 on the two CP ranks
    for schedule in ("cpp", "vpp", "vpp-async"):
        for pp_rank in range(2):
            per_cp = [results[pp_rank * CP + c][(model_type, "kv_rows", schedule)] for c in range(CP)]
            for rows in zip(*per_cp):  # one stage of this pipeline rank, on each of its CP ranks
                assert sum(rows) == tokens and max(rows) <= math.ceil(tokens / CP) + 1, (schedule, pp_rank, rows)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_cp2_pp2_greedy_decode_equals_transformers_generate(model_type, results, hf_greedy):
    for res in results:
        assert res[(model_type, "greedy")] == hf_greedy[model_type]


@pytest.mark.parametrize("model_type", STREAM_FAMILIES)
def test_cp2_pp2_stream_with_a_cached_prefix(model_type, results):
    _check_logits(results, (model_type, "stream"), LAST["vpp-async"])


def test_rows_sent_to_the_wrong_cp_rank_are_caught(results):
    assert [res[("pp_ranks",)][1] for res in results] == [(0, 3), (1, 2), (1, 2), (0, 3)]  # really permuted
    for rank in (0, 1):  # pipeline rank 0 holds the V's last stage
        error = results[rank][("permuted",)]
        assert error > 100 * REL, f"rows on the wrong CP rank went unnoticed: {error:.2e}"
