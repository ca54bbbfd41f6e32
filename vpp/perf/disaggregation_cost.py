"""Prefill/decode disaggregation in the cost model: a decode step's time on a layout, and the KV
hand-over from a prefill instance to a decode instance (modelled, pure Python).

Decode step (one request, one token, ``context`` tokens cached). The token runs through every layer
in order, so the step is the sum over layers of the ops of one token (:func:`decode_layer_ops`: the
prefill ops of :func:`~.ops.layer_ops` with c = 1, except that attention reads the cache as decoders
do -- GQA over its K/V heads, MLA absorbed into the latent space (no per-token prefix rebuild, which
only chunked prefill pays), DSA over its top-k -- and the MoE reads only the experts its token picks),
plus the embedding and the LM head, plus one point-to-point hop for every consecutive pair of stages
on different ranks and, when the last stage is not on stage 0's rank, one more to bring the token
back::

    tpot = sum_layers ops(1 token, context) + embed + head + hops * (latency + hidden x act x pp_tensors / (bw x eff))

A V on P ranks crosses ranks 2P - 2 times and ends where it began (the fold points are local); a
loop crosses P - 1 times and returns once (P hops); one TP group (P = 1) has none but reads 1/TP of
the weights per device with TP-sized collectives.

Hand-over (``tokens`` cached): decode rank r needs ``tokens x kv_bytes_per_token_layer(arch, tp_d)``
bytes for each layer it holds (MLA latents and DSA indexer keys replicated on every TP rank, GQA KV
heads split), sent once; a prefill TP group shares the sending of what its layers owe. All transfers
run at once, so the time is the busiest device's bytes over the link between the instances
(``cp_link_bw``, else ``pp_link_bw``, else ``link_bw``: the instances are on different nodes where
the device says so) plus one latency.

Memory: a rank holds its layers' weights (:func:`~.rank_memory.layer_weight_bytes`, the embedding / head
on their stages) and their caches at ``context`` tokens; ``fits`` compares that with ``mem_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .arch import Arch
from .hardware import Device
from .rank_memory import kv_bytes_per_token_layer, layer_weight_bytes
from .ops import (Op, Parallel, _heads, _mla_projections, allreduce, embed_ops, ffn_ops, gemm, head_ops, layer_ops,
                  pp_message_bytes)


@dataclass(frozen=True)
class DecodeStep:
    """A modelled decode step: ``seconds`` = ``layers_s`` + ``ends_s`` (embedding, head) + ``hops`` x
    ``hop_s``; ``rank_bytes`` the busiest rank's weights + caches, ``fits`` whether that fits."""

    seconds: float
    layers_s: float
    ends_s: float
    hops: int
    hop_s: float
    rank_bytes: float
    fits: bool


@dataclass(frozen=True)
class Handover:
    """A modelled KV hand-over: bytes in all, the busiest device's bytes, seconds."""

    total_bytes: float
    busiest_bytes: float
    seconds: float


def rank_hops(layout) -> int:
    """Point-to-point hops a token makes through ``layout``'s stages, the return to stage 0 included."""
    hops = sum(layout.rank_of(s) != layout.rank_of(s + 1) for s in range(layout.num_stages - 1))
    return hops + (layout.rank_of(layout.last_stage) != layout.rank_of(0))


def decode_layer_ops(arch: Arch, layer: int, context: int, par: Parallel) -> list[Op]:
    """The ops of one decode token on layer ``layer`` with ``context`` tokens cached (module docstring)."""
    if arch.attention == "dsa":
        return layer_ops(arch, layer, 1, context, par)
    h, d, act = _heads(arch, par), arch.hidden, par.act_bytes
    keys = context + 1
    if arch.attention == "gqa":
        kv = max(1, arch.kv_heads // par.tp)
        attn = [gemm("qkv_proj", 1, d, (h + 2 * kv) * arch.head_dim, par, lowp=True),
                Op("qk_norm_rope_cache", "mem", "elementwise", bytes=(h + 3 * kv) * arch.head_dim * act * 4, kernels=3),
                Op("attention", "attn", "attention", flops=4.0 * keys * h * arch.head_dim,
                   bytes=keys * 2 * kv * arch.head_dim * par.kv_bytes),
                gemm("o_proj", 1, h * arch.head_dim, d, par, lowp=True)]
    else:  # MLA, absorbed: q_nope W_UK, attention over the latent rows, W_UV
        lat = arch.kv_lora + arch.rope
        attn = _mla_projections(arch, 1, par, h, absorbed=True) + [
            Op("q_absorb", "gemm", "gemm", flops=2.0 * h * arch.nope * arch.kv_lora,
               bytes=h * arch.nope * arch.kv_lora * 2 + h * (arch.nope + arch.kv_lora) * act),
            Op("attention", "attn", "attention", flops=2.0 * keys * h * (lat + arch.kv_lora), bytes=keys * lat * par.kv_bytes),
            Op("v_absorb", "gemm", "gemm", flops=2.0 * h * arch.kv_lora * arch.v_dim,
               bytes=h * arch.kv_lora * arch.v_dim * 2 + h * (arch.kv_lora + arch.v_dim) * act),
            gemm("o_proj", 1, h * arch.v_dim, d, par, lowp=True)]
    norms = Op("add_rmsnorm", "mem", "elementwise", bytes=8.0 * d * act, kernels=2)
    return attn + [allreduce("attn_allreduce", 1, arch, par)] + ffn_ops(arch, layer, 1, par) + [norms]


def _layers_of_rank(layout, rank: int) -> list[int]:
    return [i for s in layout.stages_of(rank) for i in layout.layers_of(s)]


def rank_bytes(arch: Arch, par: Parallel, layout, context: int) -> float:
    """The busiest rank's weights and caches (``context`` tokens) on ``layout``."""
    kv = kv_bytes_per_token_layer(arch, par) * context
    out = []
    for r in range(layout.num_ranks):
        layers = _layers_of_rank(layout, r)
        stages = layout.stages_of(r)
        ends = arch.vocab * arch.hidden * 2 / par.tp * ((0 in stages) + (layout.last_stage in stages))
        out.append(sum(layer_weight_bytes(arch, i, par) + kv for i in layers) + ends)
    return max(out)


def decode_step(arch: Arch, device: Device, par: Parallel, layout, context: int) -> DecodeStep:
    """The modelled time of one decode step after ``context`` cached tokens (module docstring)."""
    if context < 1:
        raise ValueError(f"context={context}: a decode step needs at least one cached token")
    layers = sum(device.op_time(op) for i in range(arch.layers) for op in decode_layer_ops(arch, i, context, par))
    ends = sum(device.op_time(op) for op in embed_ops(arch, 1, par) + head_ops(arch, 1, par))
    hops = rank_hops(layout)
    bw = (device.pp_link_bw or device.link_bw) * device.eff_link
    hop = device.link_latency + pp_message_bytes(arch, 1, par) / bw
    held = rank_bytes(arch, par, layout, context)
    return DecodeStep(layers + ends + hops * hop, layers, ends, hops, hop, held, held <= device.mem_bytes)


def handover(arch: Arch, device: Device, prefill: tuple[Parallel, object], decode: tuple[Parallel, object],
             tokens: int) -> Handover:
    """The modelled hand-over of ``tokens`` cached tokens from a prefill (par, layout) to a decode
    (par, layout) instance (module docstring)."""
    (p_par, p_layout), (d_par, d_layout) = prefill, decode
    per_layer_rank = kv_bytes_per_token_layer(arch, d_par) * tokens  # one decode TP rank, one layer
    owner = {i: r for r in range(p_layout.num_ranks) for i in _layers_of_rank(p_layout, r)}
    recv = [len(_layers_of_rank(d_layout, r)) * per_layer_rank for r in range(d_layout.num_ranks)]
    send = [0.0] * p_layout.num_ranks
    for r in range(d_layout.num_ranks):
        for i in _layers_of_rank(d_layout, r):
            send[owner[i]] += per_layer_rank * d_par.tp / p_par.tp  # every decode TP rank's copy, shared
    total = sum(recv) * d_par.tp
    busiest = max(max(recv), max(send))
    bw = (device.cp_link_bw or device.pp_link_bw or device.link_bw) * device.eff_link
    return Handover(total, busiest, device.link_latency + busiest / bw)


__all__ = ["DecodeStep", "Handover", "decode_layer_ops", "decode_step", "handover", "rank_bytes", "rank_hops"]
