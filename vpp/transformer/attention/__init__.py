"""Tensor-parallel attention for chunked prefill: GQA (Qwen3), MLA (DeepSeek-V3) and DSA
(DeepSeek-V3.2, GLM-5), with per-request caches and one place that picks the kernel."""

from vpp.transformer.attention.cache import GrowingBuffer, RequestCache
from vpp.transformer.attention.chunk import Batch, Chunk
from vpp.transformer.attention.dsa import DSASpec, Indexer, sparse_latent_attention
from vpp.transformer.attention.gqa import GQAttention, KVHeadLinear, kv_head_shard
from vpp.transformer.attention.kernel import attention_lse, causal_attention, kernel_for, merge_partials
from vpp.transformer.attention.mla import MLAttention, MLASpec
from vpp.transformer.attention.rope import RopeSpec, RotaryEmbedding, apply_rope, apply_rope_interleaved
from vpp.transformer.attention.workspace import default_budget, set_workspace_bytes

__all__ = [
    "Batch", "Chunk", "DSASpec", "GQAttention", "GrowingBuffer", "Indexer", "KVHeadLinear", "MLASpec", "MLAttention",
    "RequestCache", "RopeSpec", "RotaryEmbedding", "apply_rope", "apply_rope_interleaved", "attention_lse",
    "causal_attention", "default_budget", "kernel_for", "kv_head_shard", "merge_partials", "set_workspace_bytes",
    "sparse_latent_attention",
]
