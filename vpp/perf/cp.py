"""Context parallelism (ring attention) in the cost model: a stage's chunk spread over ``cp`` devices.

Deployment. Each pipeline stage runs on ``cp`` context-parallel ranks, each a tensor-parallel group of
``tp`` devices (``cp x tp`` devices per stage; ``pp`` stages). A chunk of ``c`` tokens after ``L``
cached tokens is sharded load-balanced (Meta's CP, arXiv 2411.01783 Sec. 3.3; Megatron's zigzag): the
chunk is cut into ``2 cp`` pieces and rank ``i`` holds pieces ``i`` and ``2 cp - 1 - i``, so every rank
holds ``q = ceil(c / cp)`` query tokens and ``L / cp`` of the cached prefix, and every rank sees the same
``causal_pairs(c, L) / cp`` query-key pairs. Per layer and device:

* everything but attention runs on the rank's ``q`` tokens: projections, FFN, norms and their TP
  collectives (:func:`vpp.perf.ops.layer_ops` with ``tokens = q``, ``prefix = 0``, attention removed);
* attention over the rank's share of pairs, in ``cp`` ring steps (one per KV block), plus a merge of the
  ``cp`` partial results per query (3 fp32 passes over ``q x heads x v``);
* MLA keys travel as latents and are up-projected per head on arrival (the prefix rebuild of
  :func:`vpp.perf.ops.mla_ops`) for every key the rank did not project itself: ``L + c - q`` rows;
* the ring (arXiv 2411.01783 Sec. 3.2): **pass-KV** sends the rank's KV block (``(L + c) / cp`` tokens of
  K and V, or of the MLA latent) to the next rank ``cp - 1`` times; **pass-Q** sends the rank's ``q``
  queries ``cp - 1`` times and returns the partial outputs with one all-to-all. A block's transfer
  overlaps the attention of the block before it (double buffering), so each of the ``cp - 1`` steps
  exposes ``max(0, transfer - step compute)``; ``ring="auto"`` takes the faster variant, as the paper's
  heuristic does (pass-KV for full prefill, pass-Q once the cached prefix dwarfs the new tokens);
* the ring's synchronisation: a step's attention cannot start before the block it reads has arrived, and
  the block's sender is the previous rank, so every step is a rendezvous of neighbours. Per step the
  ring waits for the slowest rank (with load-balanced sharding every rank holds the same pairs in every
  step: 2 piece-blocks of (c / 2cp)^2 each, none ragged but the last piece) and pays one message's
  latency that no compute hides (the arrival signal of the block, ``cp_p2p`` of zero bytes), so
  ``(cp - 1) x (latency + straggle)`` per layer is exposed (:attr:`Ring.sync`);
* MoE: experts spread over all ``cp x tp`` devices of the stage (EP = cp x tp, so that the weights fit;
  :func:`ep_devices`); the rows routed to another CP rank's experts travel by all-to-all, there and
  back (``(cp - 1) / cp`` of the rank's ``q k / tp`` rows, booked as communication). The expert
  compute per device is unchanged (``q k / tp`` rows).

The ring uses the fast link while ``cp x tp`` devices fit one node (:meth:`Device.ring_bw`), the network
otherwise. A PP hand-over moves each rank's ``q`` tokens. With ``cp = 1`` every number equals
:class:`~.deployment.DeploymentCost`'s. DSA (sparse attention with an indexer) is not modelled here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .arch import Arch
from .deployment import DeploymentCost
from .hardware import Device
from .ops import Op, Parallel, causal_pairs, gemm, layer_ops

RINGS = ("auto", "rule", "pass-kv", "pass-q")
EXPERTS = ("cp", "rank")
RING_ATTENTION_OPS = ("attention",)


@dataclass(frozen=True)
class Ring:
    """One layer's ring on one device: per-step compute and transfer, and what stays exposed."""

    steps: int
    step_compute: float
    kv_transfer: float
    q_transfer: float
    q_return: float
    variant: str
    sync: float = 0.0          # per ring step: the arrival signal's latency plus the wait for the slowest rank

    @property
    def exposed_kv(self) -> float:
        return (self.steps - 1) * (max(0.0, self.kv_transfer - self.step_compute) + self.sync)

    @property
    def exposed_q(self) -> float:
        return (self.steps - 1) * (max(0.0, self.q_transfer - self.step_compute) + self.sync) + self.q_return

    @property
    def exposed(self) -> float:
        if self.steps <= 1:
            return 0.0
        return {"pass-kv": self.exposed_kv, "pass-q": self.exposed_q}.get(self.variant,
                                                                          min(self.exposed_kv, self.exposed_q))

    @property
    def chosen(self) -> str:
        if self.variant != "auto":
            return self.variant
        return "pass-kv" if self.exposed_kv <= self.exposed_q else "pass-q"


def kv_per_q(arch: Arch) -> float:
    """Bytes of a token's travelling keys over its query's bytes (Meta's rule's threshold): ``2 kv_heads /
    q_heads`` for GQA; the compressed latent and rope key over every head's query for MLA."""
    if arch.attention == "gqa":
        return 2.0 * arch.kv_heads / arch.heads
    return (arch.kv_lora + arch.rope) / (arch.heads * (arch.nope + arch.rope))


def meta_rule(tokens: int, prefix: int, arch: Arch) -> str:
    """The ring variant Meta's rule picks for a chunk (the runtime's ``--cp-attention auto``): pass-KV
    when the new tokens are at least :func:`kv_per_q` of the keys, else pass-Q."""
    return "pass-kv" if tokens / (tokens + prefix) >= kv_per_q(arch) else "pass-q"


def straggle(tokens: int, cp: int, attn: float) -> float:
    """Seconds per ring step the ring waits for its slowest rank: with ``2 cp`` pieces of ``tokens / 2cp``
    (rounded up on all but the last), the ranks holding full pieces carry at most one piece row more than
    the mean; the step takes the slowest rank's time, ``attn / cp`` scaled by that excess."""
    piece = math.ceil(tokens / (2 * cp))
    mean = tokens / (2 * cp)
    return (attn / cp) * (piece / mean - 1.0) if mean > 0 else 0.0


def ep_devices(par: Parallel, cp: int) -> int:
    """Devices the experts spread over under context parallelism: the whole stage (cp x tp)."""
    return par.tp * cp


def kv_block_bytes(arch: Arch, tokens: float, par: Parallel) -> float:
    """Bytes one device sends to pass ``tokens`` cached keys: its KV heads' K and V, or the MLA latent."""
    if arch.attention == "gqa":
        return tokens * 2 * max(1, arch.kv_heads // par.tp) * arch.head_dim * par.kv_bytes
    return tokens * (arch.kv_lora + arch.rope) * par.kv_bytes


def q_block_bytes(arch: Arch, tokens: float, par: Parallel) -> float:
    """Bytes of ``tokens`` queries of one device's heads (pass-Q)."""
    h = arch.heads // par.tp
    dim = arch.head_dim if arch.attention == "gqa" else arch.nope + arch.rope
    return tokens * h * dim * par.act_bytes


def ring_attention_ops(arch: Arch, tokens: int, prefix: int, par: Parallel, cp: int) -> list[Op]:
    """One device's attention work for a chunk under CP (see the module docstring)."""
    h = arch.heads // par.tp
    q = math.ceil(tokens / cp)
    pairs = causal_pairs(tokens, prefix) / cp
    ops = []
    if arch.attention == "gqa":
        ops.append(Op("attention", "attn", "attention", flops=4.0 * pairs * h * arch.head_dim, kernels=cp))
        v_dim = arch.head_dim
    else:
        rows = prefix + tokens - q                         # keys projected on other ranks (or cached)
        lat = arch.kv_lora + arch.rope
        if rows > 0:
            ops += [Op("prefix_gather", "mem", "prefix_mem", bytes=2.0 * rows * lat * par.kv_bytes),
                    gemm("prefix_kv_up", rows, arch.kv_lora, h * (arch.nope + arch.v_dim), par, category="prefix_gemm"),
                    Op("prefix_slice", "mem", "prefix_mem", kernels=4,
                       bytes=rows * h * (2 * (arch.nope + arch.v_dim) + 2 * (arch.nope + arch.rope)) * par.act_bytes)]
        ops.append(Op("attention", "attn", "attention", flops=2.0 * pairs * h * (arch.nope + arch.rope + arch.v_dim),
                      kernels=cp))
        v_dim = arch.v_dim
    if cp > 1:
        ops.append(Op("attention_merge", "mem", "attention", bytes=3.0 * (cp - 1) * q * h * v_dim * 4))
    return ops


class ContextParallelCost(DeploymentCost):
    """:class:`~.deployment.DeploymentCost` with every stage spread over ``cp`` ring-attention ranks.

    ``par`` is one device's tensor parallelism; ``experts="cp"`` spreads the experts over the stage's
    ``cp x tp`` devices whatever ``par.ep`` says (see the module docstring), ``"rank"`` keeps them on
    every CP rank (each its TP share, no all-to-all: vpp's runtime today). ``ring`` picks pass-KV,
    pass-Q, the faster per chunk ("auto"), or what Meta's rule picks (``"rule"``, as the runtime's
    ``--cp-attention auto`` does, :func:`meta_rule`)."""

    def __init__(self, arch: Arch, device: Device, layout, par: Parallel | None = None, *, cp: int = 1,
                 ring: str = "auto", experts: str = "cp", overlap: float | None = None, sync_steps: bool = False):
        if cp < 1:
            raise ValueError(f"cp={cp} must be >= 1")
        if ring not in RINGS:
            raise ValueError(f"ring={ring!r}; expected one of {RINGS}")
        if experts not in EXPERTS:
            raise ValueError(f"experts={experts!r}; expected one of {EXPERTS}")
        if arch.attention == "dsa" and cp > 1:
            raise ValueError(f"{arch.name}: context parallelism is not modelled for DSA (sparse attention "
                             f"with an indexer); use cp=1")
        par = par or Parallel()
        self.cp, self.ring, self.experts = cp, ring, experts
        super().__init__(arch, device, layout, Parallel(tp=par.tp, ep=par.tp, act_bytes=par.act_bytes,
                                                        weight_bytes=par.weight_bytes, kv_bytes=par.kv_bytes,
                                                        indexer_replicated=par.indexer_replicated,
                                                        pp_tensors=par.pp_tensors), overlap=overlap,
                         sync_steps=sync_steps)
        self.moe_par = Parallel(tp=par.tp, ep=ep_devices(par, cp) if experts == "cp" else par.tp, act_bytes=par.act_bytes,
                                weight_bytes=par.weight_bytes, kv_bytes=par.kv_bytes, pp_tensors=par.pp_tensors)
        self.ring_bw = device.ring_bw(par.tp * cp)

    def __repr__(self) -> str:
        return (f"ContextParallelCost({self.arch.name} on {self.device.name}, cp={self.cp} x tp={self.par.tp}, "
                f"ring={self.ring}, experts={self.experts}, {self.layout.describe()})")

    def local_tokens(self, tokens: int) -> int:
        return math.ceil(int(tokens) / self.cp)

    def ring_of(self, layer: int, tokens: int, prefix: int) -> Ring:
        """The ring of one layer on a chunk: per-step compute, transfers, and the exposed part."""
        dev, par, cp = self.device, self.par, self.cp
        attn = sum(dev.op_time(op) for op in ring_attention_ops(self.arch, tokens, prefix, par, cp))
        q = self.local_tokens(tokens)
        kv = dev.cp_p2p(kv_block_bytes(self.arch, (prefix + tokens) / cp, par), self.ring_bw)
        qs = dev.cp_p2p(q_block_bytes(self.arch, q, par), self.ring_bw)
        v_dim = self.arch.head_dim if self.arch.attention == "gqa" else self.arch.v_dim
        ret = dev.alltoall((cp - 1) * q * (self.arch.heads // par.tp) * (v_dim + 1) * 4, cp, self.ring_bw)
        variant = meta_rule(tokens, prefix, self.arch) if self.ring == "rule" else self.ring
        return Ring(cp, attn / cp, kv, qs, ret, variant, sync=dev.cp_p2p(0.0, self.ring_bw) + straggle(tokens, cp, attn))

    def _layer_breakdown(self, kind: tuple, tokens: int, prefix: int) -> dict:
        if self.cp == 1:
            return super()._layer_breakdown(kind, tokens, prefix)
        layer = self._example[kind]
        q = self.local_tokens(tokens)
        local = [op for op in layer_ops(self.arch, layer, q, 0, self.par) if op.name not in RING_ATTENTION_OPS]
        out = self.ops_breakdown(local + ring_attention_ops(self.arch, tokens, prefix, self.par, self.cp))
        out["cp_comm"] += self.ring_of(layer, tokens, prefix).exposed
        if self.arch.is_moe(layer) and self.experts == "cp":
            rows = q / self.par.tp * self.arch.top_k          # this device's share of its rank's token-expert rows
            nbytes = rows * self.arch.hidden * self.par.act_bytes
            out["cp_comm"] += 2 * self.device.alltoall(nbytes, self.cp, self.ring_bw)   # dispatch and combine
        return dict(out)


def cp_weight_bytes(arch: Arch, layers, par: Parallel, cp: int, *, embed: bool, head: bool) -> float:
    """Weights one device of a CP stage holds: its layers (experts over cp x tp devices), plus the
    vocab-parallel embedding / LM head where the stage has them."""
    from .rank_memory import layer_weight_bytes
    moe = Parallel(tp=par.tp, ep=ep_devices(par, cp), weight_bytes=par.weight_bytes)
    vocab = arch.vocab / par.tp * arch.hidden * 2
    return sum(layer_weight_bytes(arch, i, moe) for i in layers) + vocab * (embed + head)


def full_prefill(arch: Arch, device: Device, par: Parallel, cp: int, tokens: int, *, ring: str = "auto") -> float:
    """Seconds to prefill ``tokens`` in one forward (no chunking, no pipeline) on ``cp`` ring-attention
    ranks of ``par.tp`` devices each: the setting of Meta's context-parallelism measurements."""
    from vpp.schedules import make_layout
    cost = ContextParallelCost(arch, device, make_layout("loop", arch.layers, 1), par, cp=cp, ring=ring)
    return cost.compute(0, tokens, 0)


def model_flops(arch: Arch, tokens: int) -> float:
    """FLOPs of a causal prefill of ``tokens``: 2 per weight per token (layers; the LM head on the last
    token only) plus causal attention (4 head_dim FLOPs per query-key pair and head)."""
    from .rank_memory import layer_weight_bytes
    weights = sum(layer_weight_bytes(arch, i, Parallel(weight_bytes=1)) for i in range(arch.layers))
    if arch.attention == "gqa":
        per_pair = 4.0 * arch.heads * arch.head_dim
    else:
        per_pair = 2.0 * arch.heads * (arch.nope + arch.rope + arch.v_dim)
    return 2.0 * weights * tokens + per_pair * causal_pairs(tokens, 0) * arch.layers


def cp_rank_memory(plan, trace, cost: ContextParallelCost) -> list:
    """Weights, KV cache and peak activations per device of each pipeline rank's CP group: experts over
    cp x tp devices, 1/cp of the cached tokens, and per chunk the working set of the rank's q tokens
    (MLA: the up-projected keys of up to 128K tokens at a time), two KV blocks of the ring and the PP
    send / receive buffers."""
    from .rank_memory import RankMemory, kv_bytes_per_token_layer, working_set
    arch, par, layout, cp = cost.arch, cost.par, cost.layout, cost.cp
    tokens_total = sum(q.length for q in plan.requests)
    out = []
    for r in range(plan.num_ranks):
        stages = layout.stages_of(r)
        layers = [i for s in stages for i in layout.layers_of(s)]
        weights = cp_weight_bytes(arch, layers, par, cp, embed=0 in stages, head=layout.last_stage in stages)
        kv = kv_bytes_per_token_layer(arch, par) * len(layers) * tokens_total / cp
        act = 0.0
        for q in plan.requests:
            for k in range(q.num_chunks):
                c, L = q.tokens(k), q.offset(k)
                local = math.ceil(c / cp)
                ring = 2 * kv_block_bytes(arch, (L + c) / cp, par) if cp > 1 else 0.0
                pp_buf = 2 * local * arch.hidden * par.act_bytes * par.pp_tensors
                act = max(act, working_set(arch, par, local, L + c - local if cp > 1 else L) + ring + pp_buf)
        out.append(RankMemory(r, weights, kv, act))
    return out


__all__ = [
    "ContextParallelCost", "EXPERTS", "RINGS", "RING_ATTENTION_OPS", "Ring", "cp_rank_memory", "cp_weight_bytes",
    "ep_devices", "full_prefill", "kv_block_bytes", "kv_per_q", "meta_rule", "model_flops", "q_block_bytes", "ring_attention_ops",
    "straggle",
]
