"""The cost model of prefill/decode disaggregation against closed forms: hops a token makes through a
layout, the hand-over's bytes, and a decode step as the sum of its layers and hops."""

from __future__ import annotations

import pytest

from vpp.perf.configs import get_arch
from vpp.perf.disaggregation_cost import decode_layer_ops, decode_step, handover, rank_hops
from vpp.perf.hardware import ASCEND_910C
from vpp.perf.ops import Parallel
from vpp.schedules import make_layout


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_hops_of_a_v_and_a_loop(pp):
    assert rank_hops(make_layout("v", 16, pp)) == 2 * pp - 2  # the fold points are local, it ends on rank 0
    assert rank_hops(make_layout("loop", 16, pp)) == (pp - 1) + (pp > 1)  # down the ranks, the token back


def test_mla_handover_bytes_are_the_replicated_latents():
    arch = get_arch("deepseek-v3.1")
    tokens, par8, par16 = 131072, Parallel(tp=8, kv_bytes=1), Parallel(tp=16, kv_bytes=1)
    h = handover(arch, ASCEND_910C, (par8, make_layout("v", arch.layers, 2)), (par16, make_layout("loop", arch.layers, 1)),
                 tokens)
    per_rank = tokens * arch.layers * (arch.kv_lora + arch.rope) * 1  # every TP rank holds the whole latent
    assert h.total_bytes == 16 * per_rank
    # 16 receivers of per_rank each; the 8 ranks of a prefill pipeline rank share what its layers owe
    busiest_send = max(16 * tokens * n * (arch.kv_lora + arch.rope) / 8 for n in (31, 30))
    assert h.busiest_bytes == max(per_rank, busiest_send)
    bw = ASCEND_910C.link_bw * ASCEND_910C.eff_link
    assert h.seconds == pytest.approx(ASCEND_910C.link_latency + h.busiest_bytes / bw)


def test_gqa_handover_bytes_split_the_kv_heads():
    arch = get_arch("qwen3-coder-30b-a3b")  # 4 KV heads
    tokens, par = 1000, Parallel(tp=2)
    h = handover(arch, ASCEND_910C, (Parallel(tp=4), make_layout("loop", arch.layers, 2)),
                 (par, make_layout("loop", arch.layers, 1)), tokens)
    assert h.total_bytes == tokens * arch.layers * 2 * arch.kv_heads * arch.head_dim * 2  # the whole cache, once


def test_decode_step_is_its_layers_plus_hops():
    arch, dev = get_arch("glm-5.2"), ASCEND_910C
    par = Parallel(tp=8, weight_bytes=1, kv_bytes=1)
    context = 65536
    layers = sum(dev.op_time(op) for i in range(arch.layers) for op in decode_layer_ops(arch, i, context, par))
    v, loop = decode_step(arch, dev, par, make_layout("v", arch.layers, 2), context), \
        decode_step(arch, dev, par, make_layout("loop", arch.layers, 2), context)
    assert v.layers_s == pytest.approx(layers) and loop.layers_s == pytest.approx(layers)
    assert v.hops == loop.hops == 2 and v.seconds == pytest.approx(loop.seconds)
    assert v.seconds == pytest.approx(layers + v.ends_s + 2 * v.hop_s)


def test_mla_decode_reads_the_latent_cache_without_a_prefix_rebuild():
    arch, par = get_arch("deepseek-v3.1"), Parallel(tp=8, kv_bytes=1)
    ops = {op.name: op for op in decode_layer_ops(arch, 5, 100_000, par)}
    assert "prefix_kv_up" not in ops and "kv_b_proj" not in ops
    assert ops["attention"].bytes == 100_001 * (arch.kv_lora + arch.rope)
