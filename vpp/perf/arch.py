"""A model's architecture as the cost model sees it, read from an HF-style config dict.

Attention kinds: ``"gqa"`` (qwen3_moe, llama-like: query heads share ``kv_heads`` K/V heads),
``"mla"`` (deepseek_v3: low-rank latent K/V, ``kv_lora + rope`` cached per token) and ``"dsa"``
(glm_moe_dsa, deepseek_v32: MLA plus a lightning indexer that picks ``index_topk`` cached tokens per
query). FFN kinds per layer: dense SwiGLU (``ffn``) or MoE (``experts`` routed, ``top_k`` active,
``shared`` shared experts, each ``moe_ffn`` wide).
"""

from __future__ import annotations

from dataclasses import dataclass

from vpp import config as hf

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
    def dense_gqa(cls, name: str, *, hidden: int, layers: int, vocab: int, heads: int, kv_heads: int,
                  ffn: int, head_dim: int | None = None) -> "Arch":
        """A dense decoder (Llama-style): GQA attention and a SwiGLU FFN of width ``ffn`` in every layer.
        Built here rather than through the HF reader, which knows only the paper's MoE families."""
        return cls(name=name, attention="gqa", hidden=hidden, layers=layers, vocab=vocab, heads=heads,
                   kv_heads=kv_heads, head_dim=head_dim or hidden // heads, ffn=ffn)

    @classmethod
    def from_config(cls, config: dict, name: str | None = None) -> "Arch":
        """The cost model's view of a Hugging Face config, read through :func:`vpp.config.model_config`
        (the same reader the models use, so dense/MoE layers, indexer layers and widths agree)."""
        cfg = hf.model_config(config)
        layers = cfg["num_hidden_layers"]
        attention = hf.attention_kind(cfg)
        experts = hf.num_experts(cfg)
        dense = tuple(i for i, t in enumerate(cfg["mlp_layer_types"]) if t == "dense") if experts else ()
        common = dict(name=name or cfg["model_type"], attention=attention, hidden=cfg["hidden_size"], layers=layers,
                      vocab=cfg["vocab_size"], heads=cfg["num_attention_heads"], ffn=cfg["intermediate_size"],
                      moe_ffn=cfg["moe_intermediate_size"], experts=experts, top_k=cfg["num_experts_per_tok"],
                      dense_layers=dense)
        if attention == "gqa":
            return cls(kv_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"], **common)
        shared_index = tuple(i for i, t in enumerate(cfg.get("indexer_types") or []) if t == "shared")
        dsa = attention == "dsa"
        return cls(q_lora=cfg["q_lora_rank"] or 0, kv_lora=cfg["kv_lora_rank"], nope=cfg["qk_nope_head_dim"],
                   rope=cfg["qk_rope_head_dim"], v_dim=cfg["v_head_dim"],
                   index_heads=cfg["index_n_heads"] if dsa else 0, index_dim=cfg["index_head_dim"] if dsa else 0,
                   index_topk=cfg["index_topk"] if dsa else 0, shared=int(cfg.get("n_shared_experts") or 0),
                   shared_index_layers=shared_index, **common)


__all__ = ["ATTENTION_KINDS", "Arch"]
