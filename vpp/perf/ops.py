"""Per-device operations of one transformer layer on a chunk: FLOPs, HBM bytes, kernel launches and
collectives, from the architecture alone (no device constants here).

A chunk of ``c`` tokens whose request has ``L`` tokens cached runs, on each of the ``tp`` ranks of a
tensor-parallel group (experts spread over ``ep`` ranks of that group, tokens replicated):

* GQA  -- QKV projection, norms/rope/cache write, causal attention over ``c L + c (c + 1) / 2`` query-key
  pairs (4 head_dim FLOPs per pair and head), output projection, all-reduce.
* MLA  -- vLLM's prefill path ("MHA mode"): replicated down-projections ``q_a`` and ``kv_a``, column-
  parallel ``q_b`` and ``kv_b``, attention with ``2 (nope + rope + v)`` FLOPs per pair and head. With a
  cached prefix, every chunk first *rebuilds* the prefix's per-head K/V from the latent cache: a gather
  of ``L (kv_lora + rope)`` values, an up-projection GEMM of ``L`` rows (the profiler's MatMulV3) and
  split/concat copies of the result (its Slice kernels), then a second attention call and a merge.
  This prefix work scales with chunks x prefix, so more, smaller chunks (DCPP) pay more of it.
* DSA  -- MLA in latent ("MQA") mode plus the lightning indexer: replicated index projections, index
  scores over all causal pairs (``2 index_heads index_dim`` FLOPs per pair, run at the low-precision
  rate), a top-k pass over the scores (4-byte scores written and read), and sparse attention over
  ``min(position, index_topk)`` keys per query, whose latent rows are gathered per query (memory).
* FFN  -- dense SwiGLU (column/row parallel) or MoE: replicated router, routed experts over ``ep``
  ranks (``c top_k / ep`` token-expert rows per rank; the expert weights hit are read once), shared
  experts TP-split, one all-reduce combining them.

Kinds: ``gemm`` and ``attn`` are timed by a roofline (FLOPs vs bytes), ``mem`` by bytes, ``allreduce``
/ ``allgather`` by the collective model; ``lowp`` marks GEMMs that run at the low-precision rate
(W8A8 weights). Categories group ops for reports: attention, indexer, prefix_gemm, prefix_mem, gemm,
moe, elementwise, tp_comm.

``per_request`` marks the ops that run over the request's own prefix (attention, the MLA prefix rebuild and
merge, DSA's index scores, top-k and sparse attention): in a step that batches several requests' pieces
into one forward they run per piece, every other op once on the step's tokens (:mod:`.batched`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .arch import Arch

KINDS = ("gemm", "attn", "mem", "allreduce", "allgather")


@dataclass(frozen=True)
class Parallel:
    """How one pipeline stage is spread: ``tp`` ranks, experts over ``ep`` of them (default ``tp``).
    Bytes per activation, weight and cached value; ``pp_tensors`` activations of width ``hidden`` are
    sent between stages (vLLM sends hidden states and the residual)."""

    tp: int = 1
    ep: int | None = None
    act_bytes: int = 2
    weight_bytes: int = 2
    kv_bytes: int = 2
    indexer_replicated: bool = True
    pp_tensors: int = 2

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp={self.tp} must be >= 1")
        if self.ep is None:
            object.__setattr__(self, "ep", self.tp)
        if self.ep < 1:
            raise ValueError(f"ep={self.ep} must be >= 1")

    @property
    def lowp(self) -> bool:
        """Weights below 2 bytes mean low-precision GEMMs (W8A8)."""
        return self.weight_bytes < 2


@dataclass(frozen=True)
class Op:
    name: str
    kind: str
    category: str
    flops: float = 0.0
    bytes: float = 0.0
    kernels: int = 1
    lowp: bool = False
    group: int = 1
    irregular: bool = False    # a selection whose memory access is not a stream (DSA's top-k over the scores)
    per_request: bool = False  # over the request's own prefix (attention and its kin): per piece in a batched step


def causal_pairs(tokens: int, prefix: int) -> float:
    """Query-key pairs of a causal chunk: every query sees the prefix and itself and earlier tokens."""
    return tokens * prefix + tokens * (tokens + 1) / 2


def sparse_pairs(tokens: int, prefix: int, topk: int) -> float:
    """Sum over the chunk's queries of min(keys visible, topk)."""
    full = max(0, min(tokens, topk - prefix))          # queries that still see fewer than topk keys
    return full * prefix + full * (full + 1) / 2 + (tokens - full) * topk


def gemm(name: str, m: float, k: int, n: int, par: Parallel, *, lowp: bool = False, category: str = "gemm",
         kernels: int = 1, per_request: bool = False) -> Op:
    """[m x k] @ [k x n]: 2mkn FLOPs; reads the weights and the input, writes the output."""
    w = par.weight_bytes if lowp else 2
    return Op(name, "gemm", category, 2.0 * m * k * n, k * n * w + m * (k + n) * par.act_bytes, kernels,
              lowp and par.lowp, per_request=per_request)


def _heads(arch: Arch, par: Parallel) -> int:
    if arch.heads % par.tp:
        raise ValueError(f"{arch.name}: {arch.heads} attention heads cannot be split over tp={par.tp}")
    return arch.heads // par.tp


def allreduce(name: str, tokens: int, arch: Arch, par: Parallel) -> Op:
    return Op(name, "allreduce", "tp_comm", bytes=tokens * arch.hidden * par.act_bytes, group=par.tp)


def gqa_ops(arch: Arch, c: int, L: int, par: Parallel) -> list[Op]:
    h, hd, d = _heads(arch, par), arch.head_dim, arch.hidden
    kv = max(1, arch.kv_heads // par.tp)
    act = par.act_bytes
    return [
        gemm("qkv_proj", c, d, (h + 2 * kv) * hd, par, lowp=True),
        Op("qk_norm_rope_cache", "mem", "elementwise", bytes=c * (h + kv) * hd * act * 4 + c * 2 * kv * hd * par.kv_bytes,
           kernels=3),
        Op("attention", "attn", "attention", flops=4.0 * causal_pairs(c, L) * h * hd, per_request=True),
        gemm("o_proj", c, h * hd, d, par, lowp=True),
        allreduce("attn_allreduce", c, arch, par),
    ]


def _mla_projections(arch: Arch, c: int, par: Parallel, h: int, *, absorbed: bool) -> list[Op]:
    d, act = arch.hidden, par.act_bytes
    ops = []
    if arch.q_lora:
        ops += [gemm("q_a_proj", c, d, arch.q_lora, par, lowp=True),
                gemm("q_b_proj", c, arch.q_lora, h * (arch.nope + arch.rope), par, lowp=True)]
    else:
        ops.append(gemm("q_proj", c, d, h * (arch.nope + arch.rope), par, lowp=True))
    ops.append(gemm("kv_a_proj", c, d, arch.kv_lora + arch.rope, par, lowp=True))
    if not absorbed:
        ops.append(gemm("kv_b_proj", c, arch.kv_lora, h * (arch.nope + arch.v_dim), par))
    ops.append(Op("mla_norm_rope_split_cache", "mem", "elementwise",
                  bytes=c * (arch.q_lora + arch.kv_lora + arch.rope) * act * 2
                  + c * h * (arch.nope + arch.rope + arch.v_dim) * act * 2
                  + c * (arch.kv_lora + arch.rope) * par.kv_bytes, kernels=6))
    return ops


def mla_ops(arch: Arch, c: int, L: int, par: Parallel) -> list[Op]:
    h, act = _heads(arch, par), par.act_bytes
    ops = _mla_projections(arch, c, par, h, absorbed=False)
    if L > 0:
        lat = arch.kv_lora + arch.rope
        ops += [
            Op("prefix_gather", "mem", "prefix_mem", bytes=2.0 * L * lat * par.kv_bytes, per_request=True),
            gemm("prefix_kv_up", L, arch.kv_lora, h * (arch.nope + arch.v_dim), par, category="prefix_gemm",
                 per_request=True),
            Op("prefix_slice", "mem", "prefix_mem",
               bytes=L * h * (2 * (arch.nope + arch.v_dim) + 2 * (arch.nope + arch.rope)) * act, kernels=4,
               per_request=True),
            Op("attention_merge", "mem", "attention", bytes=3.0 * c * h * arch.v_dim * 4, per_request=True),
        ]
    ops += [
        Op("attention", "attn", "attention", flops=2.0 * causal_pairs(c, L) * h * (arch.nope + arch.rope + arch.v_dim),
           kernels=2 if L > 0 else 1, per_request=True),
        gemm("o_proj", c, h * arch.v_dim, arch.hidden, par, lowp=True),
        allreduce("attn_allreduce", c, arch, par),
    ]
    return ops


def dsa_ops(arch: Arch, c: int, L: int, par: Parallel, *, indexer: bool = True) -> list[Op]:
    """``indexer=False``: a layer that reuses the previous layer's top-k (GLM-5's shared indexer)."""
    h, act, d = _heads(arch, par), par.act_bytes, arch.hidden
    ih = arch.index_heads if par.indexer_replicated else max(1, arch.index_heads // par.tp)
    lat = arch.kv_lora + arch.rope
    pairs = causal_pairs(c, L)
    sparse = sparse_pairs(c, L, arch.index_topk)
    ops = _mla_projections(arch, c, par, h, absorbed=True)
    ops.append(Op("q_absorb", "gemm", "gemm", flops=2.0 * c * h * arch.nope * arch.kv_lora,
                  bytes=h * arch.nope * arch.kv_lora * 2 + c * h * (arch.nope + arch.kv_lora) * act))
    if indexer:
        ops += _indexer_ops(arch, c, L, par, ih, pairs)
    ops += [
        Op("sparse_attention", "attn", "attention", flops=2.0 * sparse * h * (lat + arch.kv_lora),
           bytes=sparse * lat * par.kv_bytes, per_request=True),
        Op("v_absorb", "gemm", "gemm", flops=2.0 * c * h * arch.kv_lora * arch.v_dim,
           bytes=h * arch.kv_lora * arch.v_dim * 2 + c * h * (arch.kv_lora + arch.v_dim) * act),
        gemm("o_proj", c, h * arch.v_dim, d, par, lowp=True),
        allreduce("attn_allreduce", c, arch, par),
    ]
    return ops


def _indexer_ops(arch: Arch, c: int, L: int, par: Parallel, ih: int, pairs: float) -> list[Op]:
    d, act = arch.hidden, par.act_bytes
    return [
        gemm("index_q_proj", c, arch.q_lora or d, ih * arch.index_dim, par, lowp=True, category="indexer"),
        gemm("index_k_proj", c, d, arch.index_dim, par, lowp=True, category="indexer"),
        gemm("index_weights_proj", c, d, ih, par, category="indexer"),
        Op("index_norm_rope_cache", "mem", "indexer", bytes=c * (ih + 2) * arch.index_dim * act * 2, kernels=3),
        Op("index_scores", "attn", "indexer", flops=2.0 * pairs * ih * arch.index_dim + 2.0 * pairs * ih,
           bytes=pairs * 4, lowp=True, per_request=True),
        Op("index_topk", "mem", "indexer", bytes=pairs * 4 * 2, kernels=1, irregular=True, per_request=True),
    ]


def ffn_ops(arch: Arch, layer: int, c: int, par: Parallel) -> list[Op]:
    d, act, tp = arch.hidden, par.act_bytes, par.tp
    if not arch.is_moe(layer):
        f = arch.ffn // tp
        return [gemm("gate_up_proj", c, d, 2 * f, par, lowp=True),
                Op("silu_mul", "mem", "elementwise", bytes=c * 3 * f * act),
                gemm("down_proj", c, f, d, par, lowp=True),
                allreduce("mlp_allreduce", c, arch, par)]
    E, k, f = arch.experts, arch.top_k, arch.moe_ffn
    rows = c * k / par.ep                                       # token-expert rows on this rank
    local = E / par.ep
    hit = local * (1.0 - (1.0 - k / E) ** c)                    # expected local experts that get a token
    w = par.weight_bytes
    ops = [gemm("router", c, d, E, par),
           Op("router_topk", "mem", "elementwise", bytes=c * E * 4 * 2, kernels=2),
           Op("permute", "mem", "elementwise", bytes=4.0 * rows * d * act, kernels=2),
           Op("experts", "gemm", "moe", flops=2.0 * rows * 3 * d * f,
              bytes=hit * 3 * d * f * w + rows * (2 * d + 4 * f) * act, kernels=3, lowp=par.lowp)]
    if arch.shared:
        fs = arch.shared * f // tp
        ops += [gemm("shared_gate_up", c, d, 2 * fs, par, lowp=True),
                Op("shared_silu_mul", "mem", "elementwise", bytes=c * 3 * fs * act),
                gemm("shared_down", c, fs, d, par, lowp=True)]
    ops.append(allreduce("moe_allreduce", c, arch, par))
    return ops


def layer_ops(arch: Arch, layer: int, tokens: int, prefix: int, par: Parallel) -> list[Op]:
    """Every op one rank runs for layer ``layer`` on a chunk of ``tokens`` after ``prefix`` cached."""
    if tokens < 1 or prefix < 0:
        raise ValueError(f"tokens={tokens}, prefix={prefix}: need tokens >= 1 and prefix >= 0")
    if arch.attention == "dsa":
        attn = dsa_ops(arch, tokens, prefix, par, indexer=arch.runs_indexer(layer))
    else:
        attn = {"gqa": gqa_ops, "mla": mla_ops}[arch.attention](arch, tokens, prefix, par)
    norms = Op("add_rmsnorm", "mem", "elementwise", bytes=8.0 * tokens * arch.hidden * par.act_bytes, kernels=2)
    return attn + ffn_ops(arch, layer, tokens, par) + [norms]


def embed_ops(arch: Arch, tokens: int, par: Parallel) -> list[Op]:
    """Stage 0 before its first layer: vocab-parallel embedding lookup and its all-reduce."""
    ops = [Op("embedding", "mem", "elementwise", bytes=2.0 * tokens * arch.hidden * par.act_bytes)]
    if par.tp > 1:
        ops.append(allreduce("embed_allreduce", tokens, arch, par))
    return ops


def head_ops(arch: Arch, tokens: int, par: Parallel, requests: int = 1) -> list[Op]:
    """The last stage after its last layer: final norm, and logits of each request's last token only
    (prefill needs one token's logits per request; ``requests`` > 1: a batched step of several
    requests' pieces), vocab-parallel, gathered."""
    vocab = math.ceil(arch.vocab / par.tp)
    ops = [Op("final_norm", "mem", "elementwise", bytes=2.0 * tokens * arch.hidden * par.act_bytes),
           gemm("lm_head", requests, arch.hidden, vocab, par)]
    if par.tp > 1:
        ops.append(Op("logits_allgather", "allgather", "tp_comm", bytes=4.0 * arch.vocab * requests, group=par.tp))
    return ops


def pp_message_bytes(arch: Arch, tokens: int, par: Parallel) -> float:
    """Bytes of one chunk's activation handed from one stage to the next (all TP ranks together)."""
    return float(tokens * arch.hidden * par.act_bytes * par.pp_tensors)


__all__ = [
    "KINDS", "Op", "Parallel", "allreduce", "causal_pairs", "dsa_ops", "embed_ops", "ffn_ops", "gemm",
    "gqa_ops", "head_ops", "layer_ops", "mla_ops", "pp_message_bytes", "sparse_pairs",
]
