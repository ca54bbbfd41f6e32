"""Memory per rank: weights, KV cache and peak activations of a simulated schedule.

* weights -- every parameter of the rank's layers as one TP rank holds it: replicated MLA down-projections
  (and the DSA indexer when replicated), column/row-parallel matrices / tp, routed experts / ep; the
  embedding on the first rank and the LM head on the rank of the last stage (both vocab-parallel).
* KV cache -- per token and layer, GQA's K and V of the rank's KV heads (at least one, replicated when
  kv_heads < tp), MLA's latent ``kv_lora + rope`` (the same on every TP rank), plus DSA's index key.
* activations -- from the trace: a chunk's stage output is resident on its producer from the end of the
  producing compute until the transfer ends (send buffer) or, for a local hand-off, until the consumer
  finishes; on the receiver from the start of the transfer until the consumer finishes. Each is
  ``tokens x hidden x pp_tensors`` values (every TP rank holds the full tensor after the all-gather). On
  top, a compute holds its working set: four hidden-sized buffers, the MoE rows' intermediate, and for
  MLA the rebuilt prefix K/V of up to 128K tokens at a time (vLLM's chunked-prefill context workspace).
"""

from __future__ import annotations

from dataclasses import dataclass

from .arch import Arch
from .ops import Parallel

MLA_WORKSPACE_TOKENS = 128 * 1024   # vLLM caps the MLA chunked-prefill context workspace at 128K tokens


@dataclass
class RankMemory:
    rank: int
    weights: float
    kv_cache: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.activations


def layer_weight_bytes(arch: Arch, layer: int, par: Parallel) -> float:
    tp, w = par.tp, par.weight_bytes
    d = arch.hidden
    if arch.attention == "gqa":
        kv = max(1, arch.kv_heads // tp)
        attn = d * (arch.heads // tp + 2 * kv) * arch.head_dim * w + arch.heads // tp * arch.head_dim * d * w
    else:
        h = arch.heads // tp
        qa = d * arch.q_lora + arch.q_lora * h * (arch.nope + arch.rope) if arch.q_lora else d * h * (arch.nope + arch.rope)
        attn = (qa + d * (arch.kv_lora + arch.rope) + h * arch.v_dim * d) * w
        attn += arch.kv_lora * h * (arch.nope + arch.v_dim) * 2          # kv_b kept in BF16
        if arch.runs_indexer(layer):  # GLM-5's shared-indexer layers hold no indexer weights
            ih = arch.index_heads if par.indexer_replicated else max(1, arch.index_heads // tp)
            attn += ((arch.q_lora or d) * ih * arch.index_dim + d * arch.index_dim) * w + d * ih * 2
    if not arch.is_moe(layer):
        ffn = 3 * d * arch.ffn // tp * w
    else:
        ffn = arch.experts / par.ep * 3 * d * arch.moe_ffn * w + d * arch.experts * 2
        ffn += 3 * d * arch.shared * arch.moe_ffn // tp * w
    return float(attn + ffn)


def kv_bytes_per_token_layer(arch: Arch, par: Parallel) -> float:
    if arch.attention == "gqa":
        return 2.0 * max(1, arch.kv_heads // par.tp) * arch.head_dim * par.kv_bytes
    extra = arch.index_dim if arch.attention == "dsa" else 0
    return float(arch.kv_lora + arch.rope + extra) * par.kv_bytes


def working_set(arch: Arch, par: Parallel, tokens: int, prefix: int) -> float:
    """Transient bytes one compute of a chunk holds on a TP rank (see the module docstring)."""
    act = par.act_bytes
    base = 4.0 * tokens * arch.hidden * act
    if arch.experts:
        base += tokens * arch.top_k / par.ep * 3 * arch.moe_ffn * act
    else:
        base += tokens * 3 * arch.ffn / par.tp * act
    if arch.attention == "mla" and prefix > 0:
        h = arch.heads // par.tp
        base += min(prefix, MLA_WORKSPACE_TOKENS) * h * (2 * arch.nope + arch.rope + arch.v_dim) * act
    return base


def rank_memory(plan, trace, cost) -> list[RankMemory]:
    """Weights, KV cache at the end of the plan's requests, and peak activations, per rank."""
    arch, par, layout = cost.arch, cost.par, cost.layout
    per_token = kv_bytes_per_token_layer(arch, par)
    tokens_total = sum(q.length for q in plan.requests)
    requests = {q.id: q for q in plan.requests}
    out = []
    for r in range(plan.num_ranks):
        layers = [i for s in layout.stages_of(r) for i in layout.layers_of(s)]
        weights = sum(layer_weight_bytes(arch, i, par) for i in layers)
        vocab = arch.vocab / par.tp * arch.hidden * 2
        weights += vocab * (0 in layout.stages_of(r)) + vocab * (layout.last_stage in layout.stages_of(r))
        kv = per_token * len(layers) * tokens_total
        out.append(RankMemory(r, weights, kv, _activation_peak(trace, r, arch, par, requests, layout)))
    return out


def _activation_peak(trace, rank, arch, par, requests, layout) -> float:
    size = lambda q, c: requests[q].tokens(c) * arch.hidden * par.act_bytes * par.pp_tensors
    consumer_end, events = {}, []
    for s in trace.spans:
        if s.kind == "compute" and s.rank == rank:
            consumer_end[(s.stage, s.request, s.chunk)] = s.end
            q = requests[s.request]
            events.append((s.start, working_set(arch, par, q.tokens(s.chunk), q.offset(s.chunk))))
            events.append((s.end, -working_set(arch, par, q.tokens(s.chunk), q.offset(s.chunk))))
    for s in trace.spans:
        if s.rank != rank:
            continue
        if s.kind == "compute" and s.stage < layout.last_stage and layout.is_local_hop(s.stage):
            end = consumer_end.get((s.stage + 1, s.request, s.chunk), s.end)
            events += [(s.end, size(s.request, s.chunk)), (end, -size(s.request, s.chunk))]
        elif s.kind == "transfer" and layout.rank_of(s.stage) == rank:            # sender: producer end .. transfer end
            start = consumer_end.get((s.stage, s.request, s.chunk), s.start)
            events += [(start, size(s.request, s.chunk)), (s.end, -size(s.request, s.chunk))]
        elif s.kind == "transfer":                                                 # receiver: transfer start .. consumer end
            end = consumer_end.get((s.stage + 1, s.request, s.chunk), s.end)
            events += [(s.start, size(s.request, s.chunk)), (end, -size(s.request, s.chunk))]
    peak = cur = 0.0
    for _, delta in sorted(events, key=lambda e: (e[0], 0 if e[1] < 0 else 1)):
        cur += delta
        peak = max(peak, cur)
    return peak


__all__ = [
    "MLA_WORKSPACE_TOKENS", "RankMemory", "kv_bytes_per_token_layer", "layer_weight_bytes", "rank_memory",
    "working_set",
]
