"""A model's architecture as the cost model sees it, read from an HF-style config dict.

Attention kinds: ``"gqa"`` (qwen3_moe, llama-like: query heads share ``kv_heads`` K/V heads),
``"mla"`` (deepseek_v3: low-rank latent K/V, ``kv_lora + rope`` cached per token) and ``"dsa"``
(glm_moe_dsa, deepseek_v32: MLA plus a lightning indexer that picks ``index_topk`` cached tokens per
query). FFN kinds per layer: dense SwiGLU (``ffn``) or MoE (``experts`` routed, ``top_k`` active,
``shared`` shared experts, each ``moe_ffn`` wide).
"""

from __future__ import annotations

from dataclasses import dataclass

ATTENTION_KINDS = ("gqa", "mla", "dsa")


@dataclass(frozen=True)
class Arch:
    name: str
    attention: str
    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int = 0
    head_dim: int = 0
    q_lora: int = 0
    kv_lora: int = 0
    nope: int = 0
    rope: int = 0
    v_dim: int = 0
    index_heads: int = 0
    index_dim: int = 0
    index_topk: int = 0
    ffn: int = 0
    moe_ffn: int = 0
    experts: int = 0
    top_k: int = 0
    shared: int = 0
    dense_layers: tuple[int, ...] = ()
    shared_index_layers: tuple[int, ...] = ()   # DSA layers reusing the previous layer's top-k (GLM-5)

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention={self.attention!r}; expected one of {ATTENTION_KINDS}")
        if self.attention == "gqa" and (self.head_dim < 1 or self.kv_heads < 1 or self.heads % self.kv_heads):
            raise ValueError(f"{self.name}: GQA needs head_dim >= 1 and heads ({self.heads}) divisible by "
                             f"kv_heads ({self.kv_heads})")
        if self.attention in ("mla", "dsa") and min(self.kv_lora, self.nope, self.rope, self.v_dim) < 1:
            raise ValueError(f"{self.name}: MLA needs kv_lora, nope, rope and v_dim >= 1")
        if self.attention == "dsa" and min(self.index_heads, self.index_dim, self.index_topk) < 1:
            raise ValueError(f"{self.name}: DSA needs index_heads, index_dim and index_topk >= 1")

    def is_moe(self, layer: int) -> bool:
        return self.experts > 0 and layer not in self.dense_layers

    def runs_indexer(self, layer: int) -> bool:
        return self.attention == "dsa" and layer not in self.shared_index_layers

    def layer_kind(self, layer: int) -> tuple[bool, bool]:
        """What a layer's cost depends on beyond its size: (MoE, runs its own DSA indexer)."""
        return self.is_moe(layer), self.runs_indexer(layer)

    @property
    def kv_bytes_per_token(self) -> int:
        """Values cached per token per layer (K and V, or the MLA latent, plus the DSA index key)."""
        if self.attention == "gqa":
            return 2 * self.kv_heads * self.head_dim
        extra = self.index_dim if self.attention == "dsa" else 0
        return self.kv_lora + self.rope + extra

    @classmethod
    def from_config(cls, cfg: dict, name: str | None = None) -> "Arch":
        mt = cfg.get("model_type", "")
        layers = int(cfg["num_hidden_layers"])
        common = dict(name=name or mt or "model", hidden=int(cfg["hidden_size"]), layers=layers,
                      vocab=int(cfg.get("vocab_size", 0)), heads=int(cfg["num_attention_heads"]),
                      ffn=int(cfg.get("intermediate_size", 0)))
        if "kv_lora_rank" in cfg:
            attention = "dsa" if ("index_topk" in cfg or mt in ("glm_moe_dsa", "deepseek_v32")) else "mla"
            experts = int(cfg.get("n_routed_experts") or 0)
            first = int(cfg.get("first_k_dense_replace", 0))
            freq = int(cfg.get("moe_layer_freq", 1) or 1)
            dense = tuple(i for i in range(layers) if experts and (i < first or i % freq))
            shared_index = tuple(i for i, t in enumerate(_indexer_types(cfg, layers)) if t == "shared") \
                if attention == "dsa" else ()
            return cls(attention=attention, q_lora=int(cfg.get("q_lora_rank") or 0),
                       kv_lora=int(cfg["kv_lora_rank"]), nope=int(cfg["qk_nope_head_dim"]),
                       rope=int(cfg["qk_rope_head_dim"]), v_dim=int(cfg["v_head_dim"]),
                       index_heads=int(cfg.get("index_n_heads", 0)) if attention == "dsa" else 0,
                       index_dim=int(cfg.get("index_head_dim", 0)) if attention == "dsa" else 0,
                       index_topk=int(cfg.get("index_topk", 0)) if attention == "dsa" else 0,
                       moe_ffn=int(cfg.get("moe_intermediate_size", 0)), experts=experts,
                       top_k=int(cfg.get("num_experts_per_tok", 0)), shared=int(cfg.get("n_shared_experts") or 0),
                       dense_layers=dense, shared_index_layers=shared_index, **common)
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        only = set(cfg.get("mlp_only_layers") or [])
        dense = tuple(i for i in range(layers) if experts and (i in only or (i + 1) % step))
        return cls(attention="gqa", kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=head_dim,
                   moe_ffn=int(cfg.get("moe_intermediate_size", 0)), experts=experts,
                   top_k=int(cfg.get("num_experts_per_tok", 0)), dense_layers=dense, **common)


def _indexer_types(cfg: dict, layers: int) -> list[str]:
    """GLM-5's per-layer indexer mode: an explicit list, a pattern string, or every ``index_topk_freq``-th
    layer from ``index_skip_topk_offset``; all "full" when none is given (DeepSeek-V3.2, GLM-5)."""
    if cfg.get("indexer_types"):
        return list(cfg["indexer_types"])
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        return [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
    freq, offset = max(int(cfg.get("index_topk_freq", 1) or 1), 1), int(cfg.get("index_skip_topk_offset", 2))
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
