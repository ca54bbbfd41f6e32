"""The per-chunk forward of every family, checked for what matters on accelerators, on CPU:

* it never reads a tensor's value on the host: run on the ``meta`` device, where every such read
  (``.item()``, ``bool(t)``, ``.tolist()``, ``nonzero``) raises, with the expert GEMM that CUDA/NPU run
  (grouped) and a workspace budget small enough to split MLA's prefix and DSA's queries into blocks;
  chunks of 40, 1, 7 and 60 tokens (a 1-token chunk is a decoding step);
* it allocates every tensor on its input's device: run on CPU under a ``meta`` *default* device, where a
  tensor made without an explicit device would land on ``meta`` and break the run or its result;
* the KV caches, reserved before the first chunk, are allocated once and exactly: their bytes equal
  tokens x (cached numbers per token, counted from the config) x bytes per number.
"""

from __future__ import annotations

import pytest
import torch

from vpp.models import build_stage, model_config, random_checkpoint
from vpp.models.tiny import TINY_CONFIGS
from vpp.parallel import ParallelGroups
from vpp.transformer.attention.workspace import set_workspace_bytes
from vpp.transformer.moe import MoE

CHUNKS = (40, 1, 7, 60)


def _config(name):
    # DSA: top-32 keys, so chunks past the 32nd token take the sparse (gathered) path
    extra = {"indexer_types": ["full", "full", "shared", "full"], "index_topk": 32} if name == "tiny-glm" else {}
    return model_config(dict(TINY_CONFIGS[name], num_hidden_layers=4, **extra))


def _cached_per_token(cfg) -> int:
    """Numbers each layer caches per token, summed over the layers (from the config alone)."""
    if cfg["model_type"] == "qwen3_moe":
        return cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"]
    latent = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    if not cfg.get("index_topk"):
        return cfg["num_hidden_layers"] * latent
    indexers = sum(t == "full" for t in cfg["indexer_types"])  # shared-indexer layers cache no keys
    return cfg["num_hidden_layers"] * latent + indexers * cfg["index_head_dim"]


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_per_chunk_forward_reads_no_tensor_value_on_the_host(name):
    cfg, meta = _config(name), torch.device("meta")
    stage = build_stage(cfg, (0, 4), ParallelGroups.single(device=meta), dtype=torch.bfloat16, device=meta)
    moes = [m for m in stage.modules() if isinstance(m, MoE)]
    assert moes
    for moe in moes:
        moe.experts.gemm = "grouped_mm"  # the accelerators' path (the CPU loop reads counts on the host)
    set_workspace_bytes(stage, 100 << 10)  # MLA: ~15 keys per block; DSA: a few queries per block
    total = sum(CHUNKS)
    stage.reserve("r", total)
    offset = 0
    for c in CHUNKS:
        out = stage(torch.randint(0, cfg["vocab_size"], (c,), device=meta), "r", offset, last_token_only=True)
        offset += c
        assert out.shape == (1, cfg["vocab_size"]) and out.device == meta
    assert stage.cache_length("r") == total
    assert stage.cache_nbytes("r") == total * _cached_per_token(cfg) * 2  # bf16, allocated exactly once


def test_the_loop_reference_would_be_caught():
    """The same check fails on the CPU reference loop (its counts go through the host)."""
    cfg, meta = _config("tiny-deepseek"), torch.device("meta")
    stage = build_stage(cfg, (0, 2), ParallelGroups.single(device=meta), dtype=torch.bfloat16, device=meta)
    with pytest.raises((NotImplementedError, RuntimeError)):
        stage(torch.zeros(8, dtype=torch.long, device=meta), "r", 0)


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_every_tensor_is_made_on_the_inputs_device(name):
    cfg = _config(name)
    stage = build_stage(cfg, (0, 4), ParallelGroups.single(), weights=random_checkpoint(cfg, 0))
    set_workspace_bytes(stage, 100 << 10)
    ids = torch.randint(0, cfg["vocab_size"], (sum(CHUNKS[:3]),), generator=torch.Generator().manual_seed(0))

    def run(request):
        out, offset = [], 0
        for c in CHUNKS[:3]:
            out.append(stage(ids[offset:offset + c], request, offset))
            offset += c
        stage.release(request)
        return torch.cat(out)

    expected = run("plain")
    with torch.device("meta"):  # anything made without a device lands here
        got = run("guarded")
    assert got.device.type == "cpu"
    assert torch.equal(got, expected)
