"""Tensor-parallel attention for chunked prefill: GQA (Qwen3), MLA (DeepSeek-V3) and DSA
(DeepSeek-V3.2, GLM-5), with per-request caches and one place that picks the kernel."""

from vpp.parallel.attention.cache import GrowingBuffer, RequestCache
from vpp.parallel.attention.chunk import Batch, Chunk
from vpp.parallel.attention.dsa import DSASpec, Indexer, sparse_latent_attention
from vpp.parallel.attention.gqa import GQAttention, KVHeadLinear, kv_head_shard
from vpp.parallel.attention.kernel import attention_lse, causal_attention, kernel_for, merge_partials
from vpp.parallel.attention.mla import MLAttention, MLASpec
from vpp.parallel.attention.rope import RopeSpec, RotaryEmbedding, apply_rope, apply_rope_interleaved
from vpp.parallel.attention.workspace import default_budget, set_workspace_bytes

__all__ = [name for name in dir() if not name.startswith("_")]
