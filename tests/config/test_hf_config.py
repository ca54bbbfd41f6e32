"""The one config reader: its defaults against transformers' configuration classes, its errors, and
every view of a model (models' tensors, the MoE block, the cost model's Arch) against each other and
against the structure transformers itself builds from the same config.

The views are compared for every supported model type on three sets of configs: the built-in tiny
models, the paper-scale models of the cost model and small configs made by transformers' own config
classes. transformers builds the reference structure on the meta device (no memory, so the paper-scale
models work too): which layers have routed experts and which have their own DSA indexer.
"""

from __future__ import annotations

import json

import pytest
import torch

from vpp.config import DEFAULTS, RELEASE_DEFAULTS, REQUIRED, SUPPORTED_MODEL_TYPES, ConfigError, model_config, read_config
from vpp.models import checkpoint_shapes
from vpp.models.blocks import moe_config
from vpp.models.tiny import TINY_CONFIGS
from vpp.transformer.moe import MoEConfig
from vpp.perf.arch import Arch
from vpp.perf.configs import CONFIGS
from vpp.perf.rank_memory import layer_weight_bytes
from vpp.perf.ops import Parallel

tf = pytest.importorskip("transformers")

CLASSES = {"qwen3_moe": "Qwen3MoeConfig", "deepseek_v3": "DeepseekV3Config", "deepseek_v32": "DeepseekV32Config",
           "glm_moe_dsa": "GlmMoeDsaConfig"}


def _hf_small(model_type: str) -> dict:
    """A small config written by transformers' own class (every key present, as save_pretrained does)."""
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=5,
                  num_attention_heads=4, num_experts_per_tok=2)
    if model_type == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(**common, num_key_value_heads=2, num_experts=8, mlp_only_layers=[1],
                                decoder_sparse_step=2)
    else:
        mla = dict(q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                   n_routed_experts=8, n_group=2, topk_group=1, first_k_dense_replace=2)
        dsa = dict(index_topk=4, index_n_heads=2, index_head_dim=8) if model_type != "deepseek_v3" else {}
        extra = dict(index_topk_freq=2) if model_type == "glm_moe_dsa" else {}
        cfg = getattr(tf, CLASSES[model_type])(**common, **mla, **dsa, **extra)
    return cfg.to_dict()


CASES = ([(name, cfg) for name, cfg in TINY_CONFIGS.items()] + [(name, cfg) for name, cfg in CONFIGS.items()]
         + [(f"hf-{t}", _hf_small(t)) for t in SUPPORTED_MODEL_TYPES])


def test_defaults_are_the_transformers_class_defaults():
    for family, defaults in DEFAULTS.items():
        hf = getattr(tf, CLASSES[family])()
        for key, value in defaults.items():
            assert getattr(hf, key) == value, (family, key, getattr(hf, key), value)
        for key in RELEASE_DEFAULTS[family]:  # only keys the class does not define (else DEFAULTS holds them)
            assert not hasattr(hf, key), (family, key)


def test_every_case_covers_every_model_type():
    assert {model_config(cfg)["model_type"] for _, cfg in CASES} == set(SUPPORTED_MODEL_TYPES)


def _transformers_structure(cfg: dict) -> tuple[list[bool], list[bool]]:
    hf_cfg = getattr(tf, CLASSES[cfg["model_type"]])(**{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(hf_cfg)
    layers = model.model.layers
    return ([hasattr(layer.mlp, "experts") for layer in layers],
            [getattr(layer.self_attn, "indexer", None) is not None for layer in layers])


@pytest.mark.parametrize("name,raw", CASES, ids=[c[0] for c in CASES])
def test_every_view_agrees(name, raw):
    cfg = model_config(raw)
    n = cfg["num_hidden_layers"]
    shapes = checkpoint_shapes(cfg)
    arch = Arch.from_config(raw)
    # which layers are MoE, which run their own indexer: models' tensors, the cost model, transformers
    moe_models = [f"model.layers.{i}.mlp.gate.weight" in shapes for i in range(n)]
    indexer_models = [f"model.layers.{i}.self_attn.indexer.wk.weight" in shapes for i in range(n)]
    assert moe_models == [arch.is_moe(i) for i in range(n)]
    assert indexer_models == [arch.runs_indexer(i) for i in range(n)]
    moe_hf, indexer_hf = _transformers_structure(raw)
    assert moe_models == moe_hf and indexer_models == indexer_hf
    # the MoE block: expert count and widths as the models name its tensors
    moe = moe_config(cfg)
    first_moe = moe_models.index(True)
    p = f"model.layers.{first_moe}.mlp."
    assert shapes[f"{p}gate.weight"] == (moe.num_experts, arch.hidden) and moe.num_experts == arch.experts
    assert shapes[f"{p}experts.0.down_proj.weight"] == (arch.hidden, arch.moe_ffn) == (arch.hidden, moe.moe_intermediate_size)
    assert moe.top_k == arch.top_k
    assert moe.shared_intermediate_size == arch.shared * arch.moe_ffn
    # every matrix of every layer: the models' tensor shapes give the cost model's weight bytes (bf16,
    # one rank; norms and biases are not in the cost model)
    for i in range(n):
        prefix = f"model.layers.{i}."
        numel = sum(_numel(s) for k, s in shapes.items() if k.startswith(prefix) and len(s) == 2)
        assert 2 * numel == layer_weight_bytes(arch, i, Parallel(tp=1, ep=1, weight_bytes=2)), (name, i)


def _numel(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def test_released_moe_configs():
    # the MoE keys of Qwen3-30B-A3B's and DeepSeek-V3's config.json (with the shape keys they carry)
    qwen = {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
            "num_attention_heads": 32, "num_key_value_heads": 4, "moe_intermediate_size": 768, "num_experts": 128,
            "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "num_hidden_layers": 48, "hidden_act": "silu"}
    q = model_config(qwen)
    assert moe_config(q) == MoEConfig(2048, 768, 128, 8, scoring="softmax", norm_topk_prob=True)
    assert q["mlp_layer_types"] == ["sparse"] * 48 and q["head_dim"] == 64
    deepseek = {"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
                "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64, "v_head_dim": 128, "moe_intermediate_size": 2048, "n_routed_experts": 256,
                "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "norm_topk_prob": True,
                "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
                "first_k_dense_replace": 3, "moe_layer_freq": 1, "num_hidden_layers": 61}
    d = model_config(deepseek)
    assert moe_config(d) == MoEConfig(7168, 2048, 256, 8, scoring="sigmoid", norm_topk_prob=True,
                                      routed_scaling_factor=2.5, n_group=8, topk_group=4, correction_bias=True,
                                      shared_intermediate_size=2048)
    assert d["mlp_layer_types"][:5] == ["dense", "dense", "dense", "sparse", "sparse"]
    assert model_config(d) == d  # normalising twice changes nothing


def test_errors_are_one_line_naming_the_file_and_key(tmp_path):
    good = dict(TINY_CONFIGS["tiny-deepseek"])
    cases = {
        "garbage.json": ('{"model_type": "deepseek_v3",\n  "hidden_size": 256,, }', r"not valid JSON: .* line 2 column"),
        "list.json": ("[1, 2, 3]", r"holds a JSON list, not an object of config keys"),
        "llama.json": (json.dumps({**good, "model_type": "llama"}), r"model_type='llama' is not supported"),
        "nohidden.json": (json.dumps({k: v for k, v in good.items() if k != "hidden_size"}),
                          r"model_type 'deepseek_v3' needs 'hidden_size' \(they fix tensor shapes and have no default\)"),
        "zero.json": (json.dumps({**good, "kv_lora_rank": 0}), r"kv_lora_rank=0 must be a positive integer"),
        "softmax.json": (json.dumps({**good, "scoring_func": "softmax"}), r"scoring_func='softmax'"),
        "window.json": (json.dumps({**TINY_CONFIGS["tiny-qwen"], "use_sliding_window": True}), r"use_sliding_window"),
    }
    for fname, (text, pattern) in cases.items():
        path = tmp_path / fname
        path.write_text(text)
        with pytest.raises(ConfigError, match=pattern) as err:
            model_config(path)
        message = str(err.value)
        assert "\n" not in message and message.startswith(str(path)), message
    with pytest.raises(ConfigError, match=r"missing: no such file"):
        read_config(tmp_path / "missing")


def test_every_shape_key_is_required():
    """Dropping any one key of REQUIRED fails (no silent default), for every family."""
    for name, raw in CASES[:3]:
        family = raw["model_type"]
        for key in REQUIRED[family]:
            with pytest.raises(ConfigError, match=repr(key)):
                model_config({k: v for k, v in raw.items() if k not in (key, "num_local_experts")})
