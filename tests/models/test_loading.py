"""Building and loading stages: errors that name what is wrong, per-stage tensor scoping, slice reads,
indexed (multi-file) checkpoints, random weights, and save_checkpoint -> transformers round trips
for every family (which also checks that vpp's checkpoint schema is exactly transformers').

Tolerance of the round trips as in test_parity.py (fp32, same products in another order).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vpp.models import (
    SUPPORTED_MODEL_TYPES, SafetensorsCheckpoint, build_stage, checkpoint_shapes, load_stage, random_checkpoint,
    save_checkpoint, stage_starts,
)
from vpp.parallel import GridSizes, Group, ParallelGroups, get_accelerator
from vpp.parallel.sharding import Shard

TOL = dict(atol=1e-4, rtol=1e-4)
SINGLE = ParallelGroups.single()


def described_groups(tp: int, ep: int = 1) -> ParallelGroups:
    """Rank 0 of a tp x ep grid, described without process groups (enough to build modules)."""
    def group(n):
        return Group(tuple(range(n)), 0)
    return ParallelGroups(GridSizes(tp, tp=tp, ep=ep), 0, tp=group(tp), pp=group(1), dp=group(1), ep=group(ep),
                          etp=group(tp // ep), accelerator=get_accelerator("cpu"), device=torch.device("cpu"))


def hf_dict(model_type: str) -> dict:
    from tests.models.hf_tiny import config
    return config(model_type).to_dict()


def test_unsupported_model_type_lists_the_supported_ones():
    with pytest.raises(ValueError, match="model_type='llama' is not supported; supported model types: "
                                         "qwen3_moe, deepseek_v3, deepseek_v32, glm_moe_dsa"):
        build_stage({"model_type": "llama"}, (0, 1), SINGLE)
    assert SUPPORTED_MODEL_TYPES == ("qwen3_moe", "deepseek_v3", "deepseek_v32", "glm_moe_dsa")


def test_sizes_that_do_not_divide_heads_or_experts_are_named():
    with pytest.raises(ValueError, match="num_attention_heads=4 is not divisible by tp=3"):
        build_stage(hf_dict("qwen3_moe"), (0, 1), described_groups(3))
    with pytest.raises(ValueError, match="num_attention_heads=4 is not divisible by tp=3"):
        build_stage(hf_dict("deepseek_v3"), (0, 1), described_groups(3))
    six_heads = {**hf_dict("qwen3_moe"), "num_attention_heads": 6, "num_key_value_heads": 3}
    with pytest.raises(ValueError, match="num_experts=8 is not divisible by ep=3"):
        build_stage(six_heads, (1, 2), described_groups(3, ep=3))
    with pytest.raises(ValueError, match="tp=2 is neither a divisor nor a multiple of num_key_value_heads=3"):
        build_stage(six_heads, (0, 1), described_groups(2))


def test_layer_ranges_are_checked():
    cfg = hf_dict("deepseek_v3")
    for bad in ((2, 2), (0, 5), (-1, 2)):
        with pytest.raises(ValueError, match=rf"layer_range=\[{bad[0]}, {bad[1]}\) is not a non-empty range "
                                             r"inside num_hidden_layers=4"):
            build_stage(cfg, bad, SINGLE)


def test_a_stage_cannot_start_at_a_shared_indexer_layer():
    cfg = hf_dict("glm_moe_dsa")
    assert cfg["indexer_types"] == ["full", "full", "shared", "full"]
    assert stage_starts(cfg) == [0, 1, 3] and stage_starts(hf_dict("deepseek_v32")) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"cannot start at layer 2: indexer_types\[2\]='shared' reuses the "
                                         r"top-k of layer 1; stages may start at layers \[0, 1, 3\]"):
        build_stage(cfg, (2, 4), SINGLE)


def test_stage_checks_offsets_and_inputs(hf_cases):
    case = hf_cases["qwen3_moe"]
    first = load_stage(case.path, (0, 2), SINGLE)
    ids = case.prompts["a"]
    with pytest.raises(ValueError, match=r"request 'a' chunk at offset 5, but this stage has cached 0"):
        first(ids[:4], "a", 5)
    first(ids[:4], "a", 0)
    with pytest.raises(ValueError, match=r"offset 0, but this stage has cached 4"):
        first(ids[:4], "a", 0)
    with pytest.raises(ValueError, match="the first stage takes token ids"):
        first(torch.zeros(3, 64), "b", 0)
    second = load_stage(case.path, (2, 4), SINGLE)
    with pytest.raises(ValueError, match=r"takes hidden states \[c, 64\], got \(4,\)"):
        second(ids[:4], "a", 0)


def _rewrite(src, dst, drop=(), add=None):
    shutil.copytree(src, dst)
    with safe_open(f"{src}/model.safetensors", "pt") as f:
        tensors = {n: f.get_tensor(n) for n in f.keys() if n not in drop}
    save_file({**tensors, **(add or {})}, f"{dst}/model.safetensors")


def test_missing_and_unexpected_tensors_are_named(hf_cases, tmp_path):
    src = hf_cases["qwen3_moe"].path
    _rewrite(src, tmp_path / "bad", drop=["model.layers.1.self_attn.k_norm.weight"],
             add={"model.layers.1.self_attn.extra.weight": torch.zeros(2),
                  "model.layers.7.mlp.gate.weight": torch.zeros(2)})
    with pytest.raises(ValueError) as err:
        load_stage(tmp_path / "bad", (0, 2), SINGLE)
    message = str(err.value)
    assert "1 tensors (model.layers.1.self_attn.k_norm.weight) missing" in message
    assert "model.layers.1.self_attn.extra.weight" in message and "model.layers.7.mlp.gate.weight" in message
    _rewrite(src, tmp_path / "bad2", drop=["model.layers.1.self_attn.k_norm.weight"])
    load_stage(tmp_path / "bad2", (2, 4), SINGLE)  # a stage checks its own layers only
    _rewrite(src, tmp_path / "bad3", add={"visual.proj.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"1 tensors \(visual.proj.weight\) unexpected"):
        load_stage(tmp_path / "bad3", (2, 4), SINGLE)


def test_slice_reads_equal_narrowed_full_tensors(hf_cases, monkeypatch):
    ckpt = SafetensorsCheckpoint(hf_cases["deepseek_v3"].path)
    full = ckpt("model.embed_tokens.weight")  # [96, 64]
    monkeypatch.setattr(SafetensorsCheckpoint, "__call__", lambda *a: pytest.fail("read the whole tensor"))
    for shard in (Shard(0, 1, 2), Shard(1, 3, 4), Shard(0, 4, 5, pad=True)):  # 96 rows over 5: padded
        assert torch.equal(ckpt.read("model.embed_tokens.weight", shard), shard.narrow(full))


def test_indexed_multi_file_checkpoint_loads_like_a_single_file(hf_cases, tmp_path):
    from tests.models.hf_tiny import model
    case = hf_cases["deepseek_v32"]
    model("deepseek_v32").save_pretrained(tmp_path, max_shard_size="100KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 3
    ids = case.prompts["b"]
    single = load_stage(case.path, (0, 4), SINGLE)(ids, "b", 0)
    torch.testing.assert_close(load_stage(tmp_path, (0, 4), SINGLE)(ids, "b", 0), single, atol=0, rtol=0)


def test_random_checkpoint_depends_only_on_seed_and_name():
    cfg = hf_dict("deepseek_v32")
    a, b, other = random_checkpoint(cfg, 0), random_checkpoint(cfg, 0), random_checkpoint(cfg, 1)
    name = "model.layers.2.mlp.experts.5.down_proj.weight"
    assert torch.equal(a(name), b(name)) and not torch.equal(a(name), other(name))
    assert a(name).shape == (64, 32) and abs(a(name).std().item() - 32 ** -0.5) < 0.02
    assert torch.equal(a("model.layers.0.input_layernorm.weight"), torch.ones(64))
    assert torch.equal(a("model.layers.1.mlp.gate.e_score_correction_bias"), torch.zeros(8))
    assert a.names() == set(checkpoint_shapes(cfg))
    with pytest.raises(KeyError):
        a("model.layers.9.mlp.gate.weight")


VARIANTS = {
    "qwen3_moe": {}, "qwen3_moe-tied": {"tie_word_embeddings": True}, "qwen3_moe-bias": {"attention_bias": True},
    "deepseek_v3": {}, "deepseek_v3-bias": {"attention_bias": True}, "deepseek_v3-no-q-lora": {"q_lora_rank": None},
    "deepseek_v32": {}, "glm_moe_dsa": {},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_save_checkpoint_round_trips_through_transformers(variant, tmp_path):
    from transformers import AutoModelForCausalLM
    cfg = {**hf_dict(variant.split("-")[0]), **VARIANTS[variant]}
    random = random_checkpoint(cfg, 3)

    def weights(name):  # random_checkpoint's biases are 0; make them count here
        t = random(name)
        return t + 0.1 * torch.randn(t.shape, generator=torch.Generator().manual_seed(len(name))) \
            if name.endswith("proj.bias") or name.endswith("mqa.bias") else t
    save_checkpoint(cfg, weights, tmp_path)
    hf, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids = torch.randint(0, cfg["vocab_size"], (21,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf.eval()(ids[None]).logits[0]
    built = build_stage(cfg, (0, 4), SINGLE, weights=weights)
    out = torch.cat([built(ids[s:s + 8], "r", s) for s in range(0, 21, 8)])
    torch.testing.assert_close(out, ref, **TOL)
    loaded = load_stage(tmp_path, (0, 4), SINGLE)
    assert torch.equal(torch.cat([loaded(ids[s:s + 8], "r", s) for s in range(0, 21, 8)]), out)
