"""Reading a model's Hugging Face ``config.json``: the one reader every other room uses (see
:mod:`.hf`). Pure Python."""

from .hf import (DEFAULTS, DTYPES, QUANT_METHODS, config_dtype, quantization, DSA_TYPES, MLA_TYPES, RELEASE_DEFAULTS, REQUIRED, SUPPORTED_MODEL_TYPES, Config, ConfigError, ConfigLike,
                 attention_kind, check_layer_range, check_types, indexer_types, mlp_layer_types, model_config, num_experts,
                 read_config, shared_intermediate_size, stage_starts)

__all__ = ["DTYPES", "QUANT_METHODS", "config_dtype", "quantization", "Config", "ConfigError", "ConfigLike", "DEFAULTS", "DSA_TYPES", "MLA_TYPES", "REQUIRED",
           "RELEASE_DEFAULTS", "SUPPORTED_MODEL_TYPES", "attention_kind", "check_layer_range", "check_types", "indexer_types", "mlp_layer_types",
           "model_config", "num_experts", "read_config", "shared_intermediate_size", "stage_starts"]
