"""The one reader of a Hugging Face ``config.json``: models, the MoE blocks and the cost model all see a
model through :func:`model_config`.

What it does, in order:

1. reads the file (or takes a dict), refusing anything that is not a JSON object with a supported
   ``model_type``, in one line that names the file;
2. checks that every key fixing a tensor's shape is present (:data:`REQUIRED`: widths, head counts,
   ranks, expert counts); these have no silent default, since a wrong width only fails later as a
   shape mismatch far from its cause;
3. fills every other key the config leaves out with the published default of the family's
   transformers 5.x configuration class (:data:`DEFAULTS`; a test compares them with the classes),
   or, for the few keys those classes lack, of the released checkpoint's own configuration code
   (:data:`RELEASE_DEFAULTS`);
4. derives, once, what every view needs and no file spells out the same way in every family:
   ``head_dim`` (Qwen3), ``mlp_layer_types`` ("dense" / "sparse" per layer, :func:`mlp_layer_types`),
   ``indexer_types`` ("full" / "shared" per layer for DSA models, :func:`indexer_types`), the expert
   count under the family's own key, and ``rope_interleave`` for V3.2 / GLM-5;
5. reads ``quantization_config`` into ``quantization`` (:func:`quantization`: None, or FP8 block
   quantization with its block size), refusing every other method in one line.

:func:`config_dtype` gives the dtype the checkpoint was released in (``torch_dtype``, or ``dtype``
as transformers 5 writes it): the dtype a model directory runs in unless the user says otherwise.

Pure Python: no torch, no process group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

SUPPORTED_MODEL_TYPES = ("qwen3_moe", "deepseek_v3", "deepseek_v32", "glm_moe_dsa")
MLA_TYPES = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")
DSA_TYPES = ("deepseek_v32", "glm_moe_dsa")

Config = dict[str, Any]
ConfigLike = Mapping[str, Any] | str | Path


class ConfigError(ValueError):
    """A config.json that cannot describe a supported model; the message is one line naming the file
    (or "config" for a dict) and the key."""


_SHAPES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
           "moe_intermediate_size", "num_experts_per_tok")
_MLA = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts")
_DSA = ("index_topk", "index_n_heads", "index_head_dim")
# keys that fix tensor shapes: a config must give them (q_lora_rank may be null: no query compression)
REQUIRED: dict[str, tuple[str, ...]] = {
    "qwen3_moe": _SHAPES + ("num_key_value_heads", "num_experts"),
    "deepseek_v3": _SHAPES + _MLA,
    "deepseek_v32": _SHAPES + _MLA + _DSA,
    "glm_moe_dsa": _SHAPES + _MLA + _DSA,
}

_DEEPSEEK = {
    "rms_norm_eps": 1e-6, "attention_bias": False, "rope_interleave": True, "tie_word_embeddings": False,
    "max_position_embeddings": 4096, "n_shared_experts": 1, "n_group": 8, "topk_group": 4,
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 3, "hidden_act": "silu",
    "num_nextn_predict_layers": 1,
}
_V32 = {k: v for k, v in _DEEPSEEK.items() if k not in ("rope_interleave", "num_nextn_predict_layers")}
# published defaults (transformers 5.x configuration classes) of the keys that do not fix a shape
DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {
        "rms_norm_eps": 1e-6, "attention_bias": False, "tie_word_embeddings": False,
        "max_position_embeddings": 32768, "use_sliding_window": False, "norm_topk_prob": False,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "hidden_act": "silu",
    },
    "deepseek_v3": _DEEPSEEK,
    "deepseek_v32": {**_V32, "max_position_embeddings": 163840},
    "glm_moe_dsa": {**_V32, "n_group": 1, "topk_group": 1, "rms_norm_eps": 1e-5, "max_position_embeddings": 202752},
}
# keys the released checkpoints' own configuration code defines but transformers' classes do not
# (DeepSeek's configuration_deepseek.py: MoE on every layer past the dense ones, sigmoid noaux_tc routing,
# one multi-token-prediction layer; V3.2 and GLM-5 always interleave MLA's rope dims)
_RELEASE = {"moe_layer_freq": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc"}
RELEASE_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"head_dim": None},  # None: hidden_size // num_attention_heads
    "deepseek_v3": _RELEASE,
    "deepseek_v32": {**_RELEASE, "rope_interleave": True, "num_nextn_predict_layers": 1},
    "glm_moe_dsa": {**_RELEASE, "rope_interleave": True, "num_nextn_predict_layers": 1},
}


def read_config(config: ConfigLike) -> Config:
    """The raw config as a dict: a copy of a mapping, or the JSON object in a ``config.json`` file or a
    model directory holding one. Raises :class:`ConfigError` (one line, naming the file) for a missing
    file, malformed JSON, a non-object, or an unsupported ``model_type``."""
    if isinstance(config, Mapping):
        raw, where = dict(config), "config"
    else:
        path = _config_file(Path(config))
        where = str(path)
        if not path.is_file():
            raise ConfigError(f"{where}: no such file (a model directory holds config.json and safetensors)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot be read ({type(exc).__name__}: {exc})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: holds a JSON {type(raw).__name__}, not an object of config keys")
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"{where}: model_type={model_type!r} is not supported; supported model types: "
                          f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    return raw


def _config_file(path: Path) -> Path:
    return path / "config.json" if path.is_dir() else path


def model_config(config: ConfigLike) -> Config:
    """The normalised config (see the module docstring): raw keys, published defaults for the rest,
    derived keys. Idempotent: a normalised config passes through unchanged."""
    raw = read_config(config)
    where = "config" if isinstance(config, Mapping) else str(_config_file(Path(config)))
    family = raw["model_type"]
    given = dict(raw)  # an explicit null stays null (q_lora_rank: no query compression)
    experts_key = "num_experts" if family == "qwen3_moe" else "n_routed_experts"
    if "num_local_experts" in given:  # transformers 5.x writes this alias for both families
        given.setdefault(experts_key, given["num_local_experts"])
    missing = [k for k in REQUIRED[family] if k not in given]
    if missing:
        raise ConfigError(f"{where}: model_type {family!r} needs {', '.join(repr(k) for k in missing)} "
                          f"(they fix tensor shapes and have no default)")
    cfg = {**RELEASE_DEFAULTS[family], **DEFAULTS[family], **given}
    check_types(cfg, where)
    if family == "qwen3_moe":
        if cfg["use_sliding_window"]:
            raise ConfigError(f"{where}: qwen3_moe with use_sliding_window=true is not supported")
        if cfg["head_dim"] is None:
            cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    else:
        if cfg["scoring_func"] != "sigmoid" or cfg["topk_method"] != "noaux_tc":
            raise ConfigError(f"{where}: scoring_func={cfg['scoring_func']!r}, topk_method={cfg['topk_method']!r}: "
                              f"only sigmoid scoring with noaux_tc (bias-corrected, group-limited) top-k is supported")
        if family != "deepseek_v3":
            cfg["rope_interleave"] = True  # V3.2 and GLM-5 always interleave MLA's rope dims
    if family in DSA_TYPES:
        cfg["indexer_types"] = indexer_types(cfg, where)
    cfg["mlp_layer_types"] = mlp_layer_types(cfg, where)
    cfg["quantization"] = quantization(cfg, where)
    return cfg


# keys that must be >= 1 where the published default is an integer (the others may be 0)
_POSITIVE = {"max_position_embeddings", "decoder_sparse_step", "moe_layer_freq", "n_group", "topk_group", "head_dim"}


def check_types(cfg: Mapping[str, Any], where: str = "config") -> None:
    """Every key that fixes a shape (:data:`REQUIRED`) is a positive integer, and every key with a
    published default has that default's type (an integer, a finite number, a boolean, a string, a list of
    integers; ``None`` defaults allow a positive integer): one :class:`ConfigError` naming the key and the
    file. Run before anything is derived per layer or per expert."""
    family = cfg["model_type"]
    for key in REQUIRED[family]:
        value = cfg[key]
        if value is None and key == "q_lora_rank":
            continue
        if not _is_int(value) or value < 1:
            raise ConfigError(f"{where}: {key}={value!r} must be a positive integer")
    for key, default in {**RELEASE_DEFAULTS[family], **DEFAULTS[family]}.items():
        value = cfg.get(key, default)
        if value is None and default is None:
            continue
        if isinstance(default, bool):
            ok, what = isinstance(value, bool), "true or false"
        elif default is None or isinstance(default, int):
            low = 1 if key in _POSITIVE or default is None else 0
            ok, what = _is_int(value) and value >= low, f"an integer >= {low}"
        elif isinstance(default, float):
            ok = (_is_int(value) or isinstance(value, float)) and 0 < value < float("inf")
            what = "a finite number > 0"
        elif isinstance(default, str):
            ok, what = isinstance(value, str), "a string"
        else:
            ok = isinstance(value, list) and all(_is_int(v) and v >= 0 for v in value)
            what = "a list of integers >= 0"
        if not ok:
            raise ConfigError(f"{where}: {key}={value!r} must be {what}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


QUANT_METHODS = ("fp8",)
_SUPPORTED_QUANT = ("supported: quant_method 'fp8' with fmt 'e4m3', activation_scheme 'dynamic' and "
                    "weight_block_size [rows, cols] (float8_e4m3fn weights with per-block weight_scale_inv, "
                    "as in the DeepSeek-V3/V3.1/V3.2 and Qwen3 FP8 releases), or no quantization_config")


def quantization(cfg: Mapping[str, Any], where: str = "config") -> dict[str, Any] | None:
    """The weight quantization ``quantization_config`` declares: None (unquantized weights), or
    ``{"method": "fp8", "fmt": "e4m3", "weight_block_size": [bo, bi]}``: each quantized ``X.weight``
    [out, in] is float8_e4m3fn and ``X.weight_scale_inv`` [ceil(out/bo), ceil(in/bi)] holds the factor
    that multiplies block (i, j) back to the real weight. Which tensors are quantized is read from
    the checkpoint (a weight with a scale partner), not from here. Activations are not quantized by
    vpp: "dynamic" activation quantization is an inference kernel's choice, and a model dequantized
    into bf16/fp32 computes the real weights' products. Every other method (awq, gptq,
    compressed-tensors, bitsandbytes, ...), format, static activation scales or per-tensor scales
    raise a :class:`ConfigError` naming the key and what is supported."""
    qc = cfg.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, Mapping):
        raise ConfigError(f"{where}: quantization_config={qc!r} is not an object; {_SUPPORTED_QUANT}")
    method = qc.get("quant_method")
    if method not in QUANT_METHODS:
        raise ConfigError(f"{where}: quantization_config.quant_method={method!r} is not supported; {_SUPPORTED_QUANT}")
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ConfigError(f"{where}: quantization_config.fmt={fmt!r} is not supported; {_SUPPORTED_QUANT}")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ConfigError(f"{where}: quantization_config.activation_scheme={scheme!r} (static activation scales) "
                          f"is not supported; {_SUPPORTED_QUANT}")
    block = qc.get("weight_block_size")
    if (not isinstance(block, (list, tuple)) or len(block) != 2
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in block)):
        raise ConfigError(f"{where}: quantization_config.weight_block_size={block!r} is not two positive integers "
                          f"(per-tensor or per-channel FP8 scales are not supported); {_SUPPORTED_QUANT}")
    return {"method": method, "fmt": fmt, "weight_block_size": [int(block[0]), int(block[1])]}


DTYPES = ("float32", "bfloat16", "float16")


def config_dtype(cfg: Mapping[str, Any], where: str = "config") -> str | None:
    """The dtype the checkpoint declares (``torch_dtype``, or ``dtype`` as transformers 5 writes it):
    one of :data:`DTYPES`, or None when the config gives none."""
    value = cfg.get("torch_dtype", cfg.get("dtype"))
    if value is None:
        return None
    name = str(value).removeprefix("torch.")
    if name not in DTYPES:
        key = "torch_dtype" if "torch_dtype" in cfg else "dtype"
        raise ConfigError(f"{where}: {key}={value!r} is not a dtype vpp runs in; supported: {', '.join(DTYPES)} "
                          f"(or choose one with --dtype)")
    return name


def mlp_layer_types(cfg: Mapping[str, Any], where: str = "config") -> list[str]:
    """Per layer, "sparse" (an MoE block) or "dense" (a SwiGLU MLP of ``intermediate_size``).

    Qwen3: MoE on every ``decoder_sparse_step``-th layer outside ``mlp_only_layers``. DeepSeek-V3: MoE
    from ``first_k_dense_replace`` on, every ``moe_layer_freq``-th layer. V3.2 / GLM-5 may spell it out
    as ``mlp_layer_types``, else as V3."""
    n = cfg["num_hidden_layers"]
    if cfg["model_type"] == "qwen3_moe":
        only, step = set(cfg.get("mlp_only_layers") or []), int(cfg.get("decoder_sparse_step") or 1)
        experts = cfg["num_experts"]
        types = ["sparse" if experts > 0 and i not in only and (i + 1) % step == 0 else "dense" for i in range(n)]
    elif cfg.get("mlp_layer_types") is not None:
        types = list(cfg["mlp_layer_types"])
    else:
        first, freq = int(cfg["first_k_dense_replace"]), int(cfg.get("moe_layer_freq") or 1)
        types = ["sparse" if i >= first and i % freq == 0 else "dense" for i in range(n)]
    if len(types) != n or set(types) - {"dense", "sparse"}:
        raise ConfigError(f"{where}: mlp_layer_types must give 'dense' or 'sparse' for each of {n} layers; got {types}")
    return types


def indexer_types(cfg: Mapping[str, Any], where: str = "config") -> list[str]:
    """Per layer of a DSA model, "full" (its own lightning indexer) or "shared" (GLM-5's IndexShare:
    reuse the previous full layer's top-k): an explicit ``indexer_types`` list, an ``index_topk_pattern``
    ("F"/"S" per layer), or every ``index_topk_freq``-th layer from ``index_skip_topk_offset``; all "full"
    by default (DeepSeek-V3.2 has no sharing)."""
    n = cfg["num_hidden_layers"]
    if cfg["model_type"] != "glm_moe_dsa":
        return ["full"] * n
    if cfg.get("indexer_types"):
        types = list(cfg["indexer_types"])
    elif cfg.get("index_topk_pattern") is not None:
        pattern = cfg["index_topk_pattern"]
        types = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern] if isinstance(pattern, str) else list(pattern)
    else:
        offset = cfg.get("index_skip_topk_offset")
        freq, offset = max(int(cfg.get("index_topk_freq") or 1), 1), 2 if offset is None else int(offset)
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if len(types) != n or types[0] != "full" or set(types) - {"full", "shared"}:
        raise ConfigError(f"{where}: indexer_types must give 'full' or 'shared' for each of {n} layers, "
                          f"starting with 'full'; got {types}")
    return types


def attention_kind(cfg: Mapping[str, Any]) -> str:
    """"gqa" (Qwen3), "mla" (DeepSeek-V3) or "dsa" (MLA + lightning indexer: V3.2, GLM-5)."""
    mt = cfg["model_type"]
    return "dsa" if mt in DSA_TYPES else "mla" if mt in MLA_TYPES else "gqa"


def num_experts(cfg: Mapping[str, Any]) -> int:
    """Routed experts per MoE layer, whatever the family calls the key."""
    return int(cfg["num_experts"] if cfg["model_type"] == "qwen3_moe" else cfg["n_routed_experts"])


def shared_intermediate_size(cfg: Mapping[str, Any]) -> int:
    """Width of the always-on shared expert (0: none; Qwen3 has none)."""
    if cfg["model_type"] == "qwen3_moe":
        return 0
    return int(cfg["moe_intermediate_size"]) * int(cfg.get("n_shared_experts") or 0)


def stage_starts(config: ConfigLike) -> list[int]:
    """Layers a pipeline stage may start at: all of them except GLM-5's shared-indexer layers, which
    reuse the top-k of the layer before them (of the normalised config, :func:`model_config`)."""
    cfg = model_config(config)
    types = cfg.get("indexer_types") or ["full"] * cfg["num_hidden_layers"]
    return [i for i, t in enumerate(types) if t == "full"]


def check_layer_range(layer_range: tuple[int, int], num_layers: int) -> tuple[int, int]:
    start, end = (int(layer_range[0]), int(layer_range[1]))
    if not 0 <= start < end <= num_layers:
        raise ValueError(f"layer_range=[{start}, {end}) is not a non-empty range inside "
                         f"num_hidden_layers={num_layers}")
    return start, end


__all__ = [
    "Config", "ConfigError", "ConfigLike", "DEFAULTS", "DSA_TYPES", "DTYPES", "MLA_TYPES", "QUANT_METHODS",
    "RELEASE_DEFAULTS", "REQUIRED", "SUPPORTED_MODEL_TYPES", "attention_kind", "check_layer_range", "check_types",
    "config_dtype", "indexer_types", "mlp_layer_types", "model_config", "num_experts", "quantization",
    "read_config", "shared_intermediate_size", "stage_starts",
]
