"""Context parallelism in the cost model: ring-attention times derived by hand on tiny configs."""

import pytest

from vpp.perf.arch import Arch
from vpp.perf.configs import LLAMA3_405B, get_arch
from vpp.perf.cp import (ContextParallelCost, cp_weight_bytes, full_prefill, kv_block_bytes, model_flops,
                         q_block_bytes, ring_attention_ops, straggle)
from vpp.perf.deployment import DeploymentCost
from vpp.perf.hardware import H100
from vpp.perf.rank_memory import layer_weight_bytes
from vpp.perf.ops import Parallel, causal_pairs, layer_ops
from vpp.perf.runs import Setup, run
from vpp.schedules import make_layout

from tests.perf.archs import DEV, TINY_GQA, TINY_MLA


def zigzag_pairs(tokens: int, prefix: int, cp: int) -> list[int]:
    """Query-key pairs each rank sees when ``tokens`` are cut into 2 cp pieces, rank i holding pieces i and
    2cp-1-i (counted token by token: query j sees prefix + j + 1 keys)."""
    piece = tokens // (2 * cp)
    out = []
    for i in range(cp):
        out.append(sum(prefix + j + 1 for p in (i, 2 * cp - 1 - i) for j in range(p * piece, (p + 1) * piece)))
    return out


@pytest.mark.parametrize("tokens,prefix,cp", [(16, 0, 2), (64, 0, 4), (48, 100, 3), (32, 7, 8)])
def test_load_balanced_sharding_gives_every_rank_the_same_share(tokens, prefix, cp):
    per_rank = zigzag_pairs(tokens, prefix, cp)
    assert sum(per_rank) == causal_pairs(tokens, prefix)
    assert max(per_rank) == min(per_rank) == causal_pairs(tokens, prefix) / cp


def test_cp1_is_the_deployment_cost():
    for cfg in (TINY_MLA, TINY_GQA):
        arch = Arch.from_config(cfg)
        layout = make_layout("loop", 2, 2)
        a = DeploymentCost(arch, DEV, layout, Parallel(tp=2, weight_bytes=1))
        b = ContextParallelCost(arch, DEV, layout, Parallel(tp=2, weight_bytes=1), cp=1)
        for stage, tokens, prefix in ((0, 16, 0), (1, 16, 48), (0, 5, 3)):
            assert b.compute(stage, tokens, prefix) == pytest.approx(a.compute(stage, tokens, prefix))
        assert b.transfer(16) == pytest.approx(a.transfer(16))


def test_gqa_ring_by_hand():
    """TINY_GQA (4 heads of 16, 2 KV heads), tp=1, cp=2, a chunk of 8 tokens after 4 cached."""
    arch, par = Arch.from_config(TINY_GQA), Parallel(tp=1)
    cost = ContextParallelCost(arch, DEV, make_layout("loop", 2, 1), par, cp=2)
    c, L = 8, 4
    pairs = (8 * 4 + 8 * 9 / 2) / 2                      # causal_pairs(8, 4) / 2 = 34
    attn = 4 * pairs * 4 * 16 / (1e12 * 0.25) + 2 * 2e-6  # 4 hd FLOPs per pair and head, 2 kernels (2 ring steps)
    merge = 3 * 1 * 4 * 4 * 16 * 4 / (1e11 * 0.5) + 2e-6  # (cp-1) partials of q=4 queries x 4 heads x 16 fp32, 3 passes
    ring = cost.ring_of(0, c, L)
    assert ring.step_compute == pytest.approx((attn + merge) / 2)
    kv = (4 + 8) / 2 * 2 * 2 * 16 * 2                     # 6 keys x (K, V) x 2 KV heads x 16 x 2 bytes
    assert kv_block_bytes(arch, 6, par) == kv
    assert ring.kv_transfer == pytest.approx(1e-6 + kv / (1e10 * 0.5))
    assert ring.q_transfer == pytest.approx(1e-6 + 4 * 4 * 16 * 2 / (1e10 * 0.5))
    assert ring.sync == pytest.approx(1e-6)                # the block's arrival signal; 2 x 2 pieces of 2: no straggler
    assert ring.exposed_kv == pytest.approx(max(0.0, ring.kv_transfer - ring.step_compute) + 1e-6)
    local = [op for op in layer_ops(arch, 0, 4, 0, par) if op.name != "attention"]
    want = sum(DEV.op_time(op) for op in local) + attn + merge + ring.exposed \
        + 2 * DEV.alltoall(4 * 2 * 64 * 2, 2)              # MoE rows (q k / tp = 8) to and from the other rank
    assert cost.layer_time(0, c, L) == pytest.approx(want)
    assert cost.local_tokens(8) == 4 and cost.local_tokens(9) == 5


def test_mla_rebuilds_every_key_it_did_not_project():
    arch, par = Arch.from_config(TINY_MLA), Parallel(tp=2, weight_bytes=1)
    ops = {op.name: op for op in ring_attention_ops(arch, 16, 32, par, 4)}
    rows = 32 + 16 - 4
    assert ops["prefix_kv_up"].flops == 2 * rows * 16 * 2 * (8 + 8)      # kv_lora 16 -> 2 heads x (nope + v)
    assert ops["attention"].flops == pytest.approx(2 * causal_pairs(16, 32) / 4 * 2 * (8 + 4 + 8))
    assert ops["attention"].kernels == 4


def test_pass_q_wins_when_the_cached_prefix_dwarfs_the_chunk():
    arch = Arch.from_config(TINY_GQA)
    slow = DEV.replace(link_bw=1e7)                       # slow ring: transfers cannot hide
    cost = ContextParallelCost(arch, slow, make_layout("loop", 2, 1), Parallel(), cp=4)
    assert cost.ring_of(0, 64, 0).chosen == "pass-kv"       # full prefill: K, V (2 KV heads) < Q (4 heads)
    assert cost.ring_of(0, 64, 100000).chosen == "pass-q"   # huge prefix: the KV block is the cached prefix
    fixed = ContextParallelCost(arch, slow, make_layout("loop", 2, 1), Parallel(), cp=4, ring="pass-kv")
    assert fixed.ring_of(0, 64, 100000).exposed == pytest.approx(fixed.ring_of(0, 64, 100000).exposed_kv)
    assert q_block_bytes(arch, 16, Parallel()) == 16 * 4 * 16 * 2


def test_experts_spread_over_the_whole_cp_group():
    arch, par = Arch.from_config(TINY_MLA), Parallel(tp=2, weight_bytes=1)
    want = layer_weight_bytes(arch, 1, Parallel(tp=2, ep=8, weight_bytes=1))
    assert cp_weight_bytes(arch, [1], par, 4, embed=False, head=False) == want
    assert want < layer_weight_bytes(arch, 1, par)
    assert cp_weight_bytes(arch, [1], par, 4, embed=True, head=True) == want + 2 * 100 / 2 * 64 * 2


def test_cp_setup_runs_and_a_full_prefill_is_one_compute():
    arch = Arch.from_config(TINY_GQA)
    setup = Setup(arch, DEV, Parallel(tp=1), pp=1, cp=2)
    r = run(setup, "cpp", [256], 512)
    cost = ContextParallelCost(arch, DEV, make_layout("loop", 2, 1), Parallel(), cp=2)
    assert r.row.total == pytest.approx(cost.compute(0, 256, 0))
    assert full_prefill(arch, DEV, Parallel(), 2, 256) == pytest.approx(r.row.total)
    with pytest.raises(ValueError, match="DSA"):
        ContextParallelCost(get_arch("glm"), DEV, make_layout("loop", 78, 1), Parallel(tp=8), cp=2)


def test_llama_anchor_attention_by_hand():
    """Llama3-405B, 2^20 tokens, TP8 x CP16 on the H100 preset: attention per GPU is the causal pairs / 16
    x 16 heads x 4 x 128 FLOPs x 126 layers at 60% of 989 TFLOPS."""
    T = 1 << 20
    par = Parallel(tp=8, weight_bytes=1)
    cost = ContextParallelCost(LLAMA3_405B, H100, make_layout("loop", 126, 1), par, cp=16)
    attn = 126 * 4 * causal_pairs(T, 0) / 16 * 16 * 128 / (989e12 * 0.6)
    merge = 126 * 3 * 15 * (T // 16) * 16 * 128 * 4 / (3.35e12 * 0.8)   # 15 partial outputs merged, fp32
    assert cost.breakdown(0, T, 0)["attention"] == pytest.approx(attn + merge, rel=1e-9)
    # 1 ms KV blocks hide behind 30 ms ring steps; each of the 15 steps of 126 layers waits for one arrival signal
    assert cost.breakdown(0, T, 0)["cp_comm"] == pytest.approx(126 * 15 * 5e-6)
    flops = model_flops(LLAMA3_405B, T)
    assert flops == pytest.approx(2 * sum(layer_weight_bytes(LLAMA3_405B, i, Parallel(weight_bytes=1))
                                          for i in range(126)) * T + 126 * 4 * 128 * 128 * causal_pairs(T, 0))


def test_a_ragged_piece_makes_the_ring_wait_for_its_slowest_rank():
    """10 tokens on cp=2: 4 pieces of ceil(10/4) = 3 tokens (the last holds 1), against a mean of 2.5: the
    ranks with full pieces take 3 / 2.5 of the mean step, so each step waits 20% of a mean step more."""
    assert straggle(10, 2, 1.0) == pytest.approx(0.5 * 0.2)
    assert straggle(16, 2, 1.0) == 0.0
    arch = Arch.from_config(TINY_GQA)
    ring = ContextParallelCost(arch, DEV, make_layout("loop", 2, 1), Parallel(tp=1), cp=2).ring_of(0, 10, 0)
    attn = 2 * ring.step_compute
    assert ring.sync == pytest.approx(DEV.cp_p2p(0.0, DEV.ring_bw(2)) + straggle(10, 2, attn))


def test_the_rule_ring_picks_what_the_runtime_picks_for_every_tiny_model():
    """ring="rule" applies the runtime's --cp-attention auto (Meta's rule) chunk by chunk: the same
    threshold as the model's own attention layer (kv_per_q), the same choice per (chunk, prefix)."""
    from vpp.models import build_stage, random_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.parallel import ParallelGroups
    from vpp.perf.cp import kv_per_q, meta_rule
    from vpp.transformer.attention.context_parallel import choose_method
    for name in ("tiny-qwen", "tiny-deepseek"):
        cfg = TINY_CONFIGS[name]
        arch = Arch.from_config(cfg, name=name)
        stage = build_stage(cfg, (0, 1), ParallelGroups.single(), weights=random_checkpoint(cfg, 0))
        layer_rule = next(iter(stage.model.layers.values())).self_attn.kv_per_q()
        assert kv_per_q(arch) == pytest.approx(layer_rule)
        cost = ContextParallelCost(arch, DEV, make_layout("loop", arch.layers, 1), Parallel(), cp=2, ring="rule")
        for tokens, prefix in ((4096, 0), (4096, 4096), (4096, 12288), (64, 100000), (512, 300)):
            want = choose_method(tokens, prefix, layer_rule)
            assert meta_rule(tokens, prefix, arch) == want == cost.ring_of(0, tokens, prefix).chosen


def test_experts_kept_on_every_cp_rank_cost_no_all_to_all():
    arch = Arch.from_config(TINY_MLA)
    layout = make_layout("loop", 2, 1)
    spread = ContextParallelCost(arch, DEV, layout, Parallel(), cp=2, ring="pass-kv")
    kept = ContextParallelCost(arch, DEV, layout, Parallel(), cp=2, ring="pass-kv", experts="rank")
    moe = next(i for i in range(arch.layers) if arch.is_moe(i))
    a, b = spread.layer_breakdown(moe, 64, 0), kept.layer_breakdown(moe, 64, 0)
    rows = 32 * arch.top_k                                   # q = 32 tokens of this rank, top-k experts each
    all_to_all = 2 * DEV.alltoall(rows * arch.hidden * Parallel().act_bytes, 2, DEV.ring_bw(2))
    assert a["cp_comm"] - b["cp_comm"] == pytest.approx(all_to_all)
    assert {k: v for k, v in a.items() if k != "cp_comm"} == pytest.approx({k: v for k, v in b.items() if k != "cp_comm"})
    with pytest.raises(ValueError, match="experts"):
        ContextParallelCost(arch, DEV, layout, Parallel(), cp=2, experts="everywhere")
