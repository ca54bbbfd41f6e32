"""The built-in tiny configurations are real configurations of their families: transformers accepts
each, its model has exactly vpp's checkpoint tensors, and with the same random weights (written by
``save_checkpoint``) transformers and vpp compute the same logits. Tolerance as in test_parity.py."""

from __future__ import annotations

import pytest
import torch

from vpp.models import build_stage, model_config, random_checkpoint, save_checkpoint, stage_starts
from vpp.models.tiny import TINY_CONFIGS
from vpp.parallel import ParallelGroups


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_tiny_config_matches_transformers(name, tmp_path):
    from transformers import AutoModelForCausalLM
    cfg = TINY_CONFIGS[name]
    n = cfg["num_hidden_layers"]
    assert cfg["max_position_embeddings"] >= 2 ** 20 and 4 <= n <= 8
    weights = random_checkpoint(cfg, 0)
    save_checkpoint(cfg, weights, tmp_path)
    hf, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert hf.config.model_type == cfg["model_type"]
    ids = torch.randint(0, cfg["vocab_size"], (24,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf.eval()(ids[None]).logits[0]
    stage = build_stage(cfg, (0, n), ParallelGroups.single(), weights=weights)
    out = torch.cat([stage(ids[s:s + 10], "r", s) for s in range(0, 24, 10)])
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_tiny_glm_has_shared_indexers_and_room_for_a_v_of_four_stages():
    cfg = model_config(TINY_CONFIGS["tiny-glm"])
    assert cfg["indexer_types"] == ["full", "full", "shared", "full", "shared", "full"]
    assert stage_starts(cfg) == [0, 1, 3, 5]  # four virtual stages of 1, 2, 2, 1 layers
