"""A decode step of several requests at once (``Stage.decode``) equals each request decoded alone,
for every family: projections and MoE routing batched, attention against each request's own cache
(GQA; MLA; DSA past index_topk keys, with GLM-5's shared indexers), caches grown by one token each.
Single process; the multi-rank decode against transformers is tests/runtime/test_generate.py."""

from __future__ import annotations

import pytest
import torch

from vpp.models import build_stage, model_config, random_checkpoint
from vpp.models.tiny import TINY_CONFIGS
from vpp.parallel import ParallelGroups

LENGTHS = (300, 257, 40)  # past tiny-glm's index_topk of 256 (sparse), at it, and far below (dense)


def _prefilled(cfg, weights):
    stage = build_stage(cfg, (0, cfg["num_hidden_layers"]), ParallelGroups.single(), weights=weights)
    g = torch.Generator().manual_seed(3)
    for q, n in enumerate(LENGTHS):
        stage(torch.randint(0, cfg["vocab_size"], (n,), generator=g), q, 0)
    return stage


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_a_batch_step_equals_each_request_alone(name):
    cfg = model_config(TINY_CONFIGS[name])
    weights = random_checkpoint(cfg, 0)
    batched, alone = _prefilled(cfg, weights), _prefilled(cfg, weights)
    tokens = torch.tensor([5, 17, 1023])
    for _ in range(2):  # two steps: the second reads what the first appended
        got = batched.decode(tokens, [0, 1, 2])
        ref = torch.cat([alone(tokens[i:i + 1], q, alone.cache_length(q), last_token_only=True)
                         for i, q in enumerate([0, 1, 2])])
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
        tokens = got.argmax(-1)
    assert [batched.cache_length(q) for q in range(3)] == [n + 2 for n in LENGTHS]


def test_decode_refuses_a_request_without_a_prompt():
    cfg = model_config(TINY_CONFIGS["tiny-qwen"])
    stage = _prefilled(cfg, random_checkpoint(cfg, 0))
    with pytest.raises(ValueError, match=r"requests \[7\] have no cached prompt to decode from"):
        stage.decode(torch.tensor([1, 2]), [0, 7])
