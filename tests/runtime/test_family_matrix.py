"""Every model family through every schedule on real gloo ranks: PP = 1..4, TP = 1 and 2 (where 4
ranks suffice), uneven partitions and a ragged last chunk. The last-token logits of every run equal a
single-process, unpipelined forward of the same weights.

Tolerance: the pipelined run computes the same chunks (fp32); TP=2 sums partial products in another
order and MoE adds expert outputs in another order, ~1e-6 on logits of size ~1-5 (see
tests/models/test_parity.py). ``atol=rtol=1e-4`` leaves two orders of magnitude; a schedule bug
(wrong chunk order, lost prefix, another request's cache) moves logits by >= 1e-2.
"""

import pytest
import torch

from vpp.models import build_stage, model_config, random_checkpoint
from vpp.models.tiny import TINY_CONFIGS
from vpp.parallel import ParallelGroups, initialize_model_parallel
from vpp.schedules import make_layout
from vpp.runtime.api import forward_prefill

pytestmark = pytest.mark.slow  # every test here runs on spawned ranks (the session's persistent worlds)

TOL = dict(atol=1e-4, rtol=1e-4)
LENGTH, CHUNK = 45, 8  # 6 chunks, the last ragged (5 tokens)
FAMILIES = ("tiny-deepseek", "tiny-qwen", "tiny-glm")


def _config(name: str) -> dict:
    cfg = dict(TINY_CONFIGS[name], num_hidden_layers=8)
    if "indexer_types" in cfg:  # every layer scores its own top-k, so any layer may start a stage
        cfg["indexer_types"] = ["full"] * 8
        cfg["index_topk"] = 16  # smaller than the prompt: sparsity is exercised
    return model_config(cfg)


def _prompt(cfg):
    return torch.randint(0, cfg["vocab_size"], (LENGTH,), generator=torch.Generator().manual_seed(5))


def _cases(pp: int):
    out = [("cpp", "loop", None), ("vpp", "v", None), ("vpp-async", "v", None)]
    if pp == 2:
        out += [("vpp", "v", [1, 3, 3, 1]), ("cpp", "loop", [3, 5])]  # uneven partitions
    return [c for c in out if (1 if c[1] == "loop" else 2) * pp <= 8]


def _run(rank, world, tp, pp):
    groups = initialize_model_parallel(tp, pp, tp)  # experts spread over the TP ranks (ep = tp)
    out = {}
    for name in FAMILIES:
        cfg = _config(name)
        weights = random_checkpoint(cfg, seed=1)
        for schedule, kind, partition in _cases(pp):
            layout = make_layout(kind, 8, pp, partition=partition)
            stages = [build_stage(cfg, layout.stage_layers[s], groups, weights=weights)
                      for s in layout.stages_of(groups.pp.rank)]
            res = forward_prefill(stages, _prompt(cfg) if 0 in layout.stages_of(groups.pp.rank) else None,
                                  CHUNK, groups, schedule=schedule)
            if res.logits is not None:
                out[(name, schedule, kind, str(partition))] = res.logits
    return out


@pytest.fixture(scope="module")
def references():
    refs = {}
    for name in FAMILIES:
        cfg = _config(name)
        full = build_stage(cfg, (0, 8), ParallelGroups.single(), weights=random_checkpoint(cfg, seed=1))
        refs[name] = full(_prompt(cfg), 0, 0, last_token_only=True)[-1]
    return refs


@pytest.mark.parametrize("tp, pp", [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2)])
def test_every_family_and_schedule_matches_the_unpipelined_forward(tp, pp, references, worlds):
    results = worlds.run(tp * pp, _run, tp, pp, timeout=600)
    merged = {}
    for per_rank in results:
        for key, logits in per_rank.items():
            merged.setdefault(key, []).append(logits)
    expected_keys = {(n, s, k, str(p)) for n in FAMILIES for s, k, p in _cases(pp)}
    assert set(merged) == expected_keys
    for (name, schedule, kind, partition), got in merged.items():
        assert len(got) == tp  # every TP rank of the last stage holds the full logits
        for logits in got:
            torch.testing.assert_close(logits, references[name], **TOL,
                                       msg=f"{name} {schedule} {kind} partition={partition} tp={tp} pp={pp}")
