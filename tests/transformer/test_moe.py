"""MoE: routing against hand-computed examples and transformers' routers; the MoE block (and the dense
MLP of dense layers) against transformers' own blocks at TP = 1, 2, 4, over ep and both dispatch modes.

References are tiny transformers models (qwen3_moe, deepseek_v3, deepseek_v32, glm_moe_dsa) with
random weights, saved with ``save_pretrained``; vpp loads the saved safetensors (per-expert HF names)
through ``load_checkpoint``.

Tolerance (fp32): vpp computes the same products as transformers, but sums a token's k expert
contributions in a different order, splits each expert's intermediate dim over etp and the shared
expert over the TP group (partial sums added by an all-reduce), and routes token slices (a matmul over
fewer rows may round differently in the last bit). Outputs are O(1-10) with reduction lengths <= 48,
so the reordering error is a few ulps (~1e-6); ``atol=rtol=1e-5`` is ~10x that and ~1e5x below any
real bug (a wrong expert, shard or weight changes values by O(0.1-1)). Router weights are scaled so
the logits are O(1): top-k gaps are far above 1e-6, so selection never flips on rounding.
"""

from __future__ import annotations

import functools
import math
import tempfile

import pytest
import torch
from hypothesis import given, settings, strategies as st

from vpp.parallel import GridSizes, Group, ParallelGroups, initialize_model_parallel, narrowing
from vpp.config import model_config
from vpp.models.blocks import build_mlp, moe_config
from vpp.transformer.moe import DenseMLP, MoE, MoEConfig, gather_rows, token_split
from vpp.transformer.router import Router, sigmoid_group_topk, softmax_topk

TOL = dict(atol=1e-5, rtol=1e-5)
TOKENS = (1, 5, 24)  # 1 and 5: ragged over ep = 2 and 4, and experts with no token


# --- routing, pure ---------------------------------------------------------------------------------

def test_softmax_topk_hand_example():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    e = [math.exp(v) for v in (1.0, 3.0, 2.0, 0.0)]
    w, ids = softmax_topk(logits, 2, norm_topk_prob=False)
    assert ids.tolist() == [[1, 2]]
    torch.testing.assert_close(w, torch.tensor([[e[1] / sum(e), e[2] / sum(e)]]))
    w, ids = softmax_topk(logits, 2, norm_topk_prob=True)
    torch.testing.assert_close(w, torch.tensor([[e[1] / (e[1] + e[2]), e[2] / (e[1] + e[2])]]))


def test_sigmoid_group_topk_hand_example():
    # scores s (sigmoid of the logits), 4 groups of 2 experts; the bias lifts group 3
    s = torch.tensor([[0.9, 0.15, 0.6, 0.5, 0.7, 0.65, 0.1, 0.3]])
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5])
    # c = s + bias = [.9 .15 | .6 .5 | .7 .65 | .6 .8]; group sums 1.05, 1.1, 1.35, 1.4 -> keep groups
    # 3 and 2 (experts 4..7; expert 0 has the best c but its group is out); top-3 c there: 7, 4, 5.
    # Weights are s (not c): .3, .7, .65, normalised by 1.65, then scaled by 2.5 in the Router.
    w, ids = sigmoid_group_topk(torch.logit(s), 3, bias=bias, n_group=4, topk_group=2, norm_topk_prob=True)
    assert ids.tolist() == [[7, 4, 5]]
    torch.testing.assert_close(w, torch.tensor([[0.3, 0.7, 0.65]]) / 1.65)
    w, ids = sigmoid_group_topk(torch.logit(s), 3, bias=None, n_group=4, topk_group=2, norm_topk_prob=False)
    # no bias: group sums 1.05, 1.1, 1.35, 0.4 -> groups 2 and 1 (experts 2..5); top-3 there: 4, 5, 2
    assert ids.tolist() == [[4, 5, 2]]
    torch.testing.assert_close(w, torch.tensor([[0.7, 0.65, 0.6]]))


@settings(max_examples=40, deadline=None)
@given(groups=st.sampled_from([(8, 1, 1), (8, 4, 2), (16, 4, 3), (12, 3, 1)]), top_k=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_group_limited_selection_properties(groups, top_k, seed):
    experts, n_group, topk_group = groups
    top_k = min(top_k, topk_group * experts // n_group)
    g = torch.Generator().manual_seed(seed)
    logits, bias = torch.randn(6, experts, generator=g) * 3, torch.randn(experts, generator=g)
    w, ids = sigmoid_group_topk(logits, top_k, bias=bias, n_group=n_group, topk_group=topk_group)
    for row in ids.tolist():
        assert len(set(row)) == top_k
        assert len({e // (experts // n_group) for e in row}) <= topk_group
    torch.testing.assert_close(w.sum(-1), torch.ones(6))


def _hf_router_cases():
    from transformers import DeepseekV3Config, GlmMoeDsaConfig, Qwen3MoeConfig
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaTopkRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    small = dict(hidden_size=32, moe_intermediate_size=16)
    yield Qwen3MoeTopKRouter, Qwen3MoeConfig(**small, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False)
    yield Qwen3MoeTopKRouter, Qwen3MoeConfig(**small, num_experts=12, num_experts_per_tok=3, norm_topk_prob=True)
    for n_group, topk_group, top_k, norm in ((4, 2, 4, True), (8, 3, 5, False), (1, 1, 3, True)):
        yield DeepseekV3TopkRouter, DeepseekV3Config(**small, n_routed_experts=16, n_group=n_group,
                                                     topk_group=topk_group, num_experts_per_tok=top_k,
                                                     norm_topk_prob=norm, routed_scaling_factor=2.5)
    yield GlmMoeDsaTopkRouter, GlmMoeDsaConfig(**small, n_routed_experts=8, num_experts_per_tok=2,
                                               routed_scaling_factor=1.5)


def test_router_matches_transformers_routers():
    g = torch.Generator().manual_seed(0)
    for cls, hf_config in _hf_router_cases():
        ref = cls(hf_config)
        cfg = moe_config(model_config(hf_config.to_dict()))
        router = Router(cfg)
        with torch.no_grad():
            ref.weight.copy_(torch.randn(ref.weight.shape, generator=g) * 0.4)
            router.weight.copy_(ref.weight)
            if cfg.correction_bias:
                ref.e_score_correction_bias.copy_(torch.randn(cfg.num_experts, generator=g) * 0.3)
                router.e_score_correction_bias.copy_(ref.e_score_correction_bias)
        x = torch.randn(64, 32, generator=g)
        _, ref_w, ref_ids = ref(x)
        w, ids = router(x)
        ref_ids, order = ref_ids.sort(-1)
        ids, mine = ids.sort(-1)
        assert torch.equal(ids, ref_ids), cls.__name__
        torch.testing.assert_close(w.gather(1, mine), ref_w.gather(1, order), **TOL)


# --- configuration ---------------------------------------------------------------------------------

def test_config_and_shape_errors_carry_the_numbers():
    with pytest.raises(ValueError, match="num_experts=10 is not divisible by n_group=4"):
        MoEConfig(32, 16, 10, 2, scoring="sigmoid", n_group=4)
    with pytest.raises(ValueError, match=r"top_k=5 must lie in 1..4 \(topk_group=2 groups of 2 experts\)"):
        MoEConfig(32, 16, 8, 5, scoring="sigmoid", n_group=4, topk_group=2)
    with pytest.raises(ValueError, match="scoring='sigmoid' only"):
        MoEConfig(32, 16, 8, 2, n_group=2)
    four = Group(ranks=(0, 1, 2, 3), rank=1)  # described, never used to communicate
    groups = ParallelGroups(GridSizes(4, tp=4, ep=4), 1, tp=four, pp=Group.single(), dp=Group.single(),
                            ep=four, etp=Group.single(1), accelerator=ParallelGroups.single().accelerator,
                            device=torch.device("cpu"))
    with pytest.raises(ValueError, match="num_experts=10 is not divisible by ep=4"):
        MoE(MoEConfig(32, 16, 10, 2), groups)
    with pytest.raises(ValueError, match="dispatch='scatter'"):
        MoE(MoEConfig(32, 16, 8, 2), groups, dispatch="scatter")
    moe = MoE(MoEConfig(32, 16, 8, 2, scoring="sigmoid", correction_bias=True, shared_intermediate_size=16), groups)
    assert [n for n in moe.checkpoint_names("m.") if ".experts." in n] == [
        f"m.experts.{e}.{p}.weight" for e in (2, 3) for p in ("gate_proj", "up_proj", "down_proj")]
    shapes = {"gate.weight": (8, 32), "gate.e_score_correction_bias": (8,), "down_proj.weight": (32, 16)}
    full = {n: torch.zeros(next((v for k, v in shapes.items() if n.endswith(k)), (16, 32)))
            for n in moe.checkpoint_names("m.")}
    with pytest.raises(KeyError, match=r"missing 5 of 11 tensors: m.gate.e_score_correction_bias, "
                                       r"m.experts.3.gate_proj.weight, .*, m.shared_experts.up_proj.weight"):
        present = {n: t for n, t in full.items() if not any(s in n for s in (".experts.3.", "bias", "shared_experts.up"))}
        moe.load_checkpoint(narrowing(present.__getitem__), "m.")
    moe.load_checkpoint(narrowing(full.__getitem__), "m.")
    full["m.experts.3.up_proj.weight"] = torch.zeros(12, 32)
    with pytest.raises(ValueError, match=r"m.experts.3.up_proj.weight: checkpoint gives \(12, 32\) \(slice 0 of 1 "
                                         r"along dim 0\), expected \(16, 32\)"):
        moe.load_checkpoint(narrowing(full.__getitem__), "m.")


@pytest.mark.parametrize("experts", [None, [1, 0, 2, 1, 0, 2]])  # None: segment i is expert i; a list: as alltoall
def test_fused_expert_pass_equals_the_per_expert_reference(experts):
    """The CPU pass (one gate/up buffer, one activation, one output buffer) against the per-expert
    reference and against each expert's MLP written out; empty segments included."""
    from vpp.transformer.expert_gemm import GroupedExperts

    g = torch.Generator().manual_seed(3)
    block = GroupedExperts(3, 16, 12, "silu")
    with torch.no_grad():
        block.gate_up_proj.copy_(torch.randn(block.gate_up_proj.shape, generator=g) / 4)
        block.down_proj.copy_(torch.randn(block.down_proj.shape, generator=g) / 4)
    counts = [4, 0, 7, 2, 5, 0] if experts else [4, 0, 9]
    x = torch.randn(sum(counts), 16, generator=g)
    out = block(x, counts, experts)
    torch.testing.assert_close(out, block.reference(x, counts, experts), atol=0, rtol=0)
    start = 0
    for e, n in zip(experts or range(3), counts):
        rows = x[start:start + n]
        gate, up = rows @ block.gate_up_proj[e, :12].T, rows @ block.gate_up_proj[e, 12:].T
        torch.testing.assert_close(out[start:start + n], (torch.nn.functional.silu(gate) * up) @ block.down_proj[e].T,
                                   **TOL)
        start += n


def test_token_split_is_balanced_and_contiguous():
    assert token_split(5, 2) == [3, 2] and token_split(1, 4) == [1, 0, 0, 0] and token_split(8, 4) == [2] * 4
    assert gather_rows(torch.ones(3, 2), [3], Group.single()).shape == (3, 2)


# --- parity against transformers' blocks -----------------------------------------------------------

def _tiny_configs():
    from transformers import DeepseekV3Config, DeepseekV32Config, GlmMoeDsaConfig, Qwen3MoeConfig

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                num_attention_heads=4, num_key_value_heads=4, experts_implementation="eager")
    mla = dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
    dsa = dict(index_head_dim=16, index_n_heads=2, index_topk=8)
    return {
        # layer 1 dense via mlp_only_layers
        "qwen3_moe": Qwen3MoeConfig(**base, head_dim=8, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                                    norm_topk_prob=True, mlp_only_layers=[1]),
        # 16 experts in 4 groups, 2 groups kept, 2 shared experts fused into one MLP of 32
        "deepseek_v3": DeepseekV3Config(**base, **mla, num_hidden_layers=2, first_k_dense_replace=1,
                                        n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4,
                                        n_shared_experts=2, routed_scaling_factor=2.5, norm_topk_prob=True),
        "deepseek_v32": DeepseekV32Config(**base, **mla, **dsa, num_hidden_layers=2, first_k_dense_replace=1,
                                          n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2,
                                          n_shared_experts=1, routed_scaling_factor=2.5),
        # one group (GLM-5's setting), no renormalisation, dense layer after a sparse one
        "glm_moe_dsa": GlmMoeDsaConfig(**base, **mla, **dsa, num_hidden_layers=2, mlp_layer_types=["sparse", "dense"],
                                       n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1,
                                       routed_scaling_factor=1.5, norm_topk_prob=False),
    }


@functools.lru_cache(maxsize=None)
def _cases() -> tuple[dict, ...]:
    """Per family: its config.json dict, the saved checkpoint's MLP tensors, and reference outputs of
    one MoE layer and one dense layer for each input. Built once, in the test process."""
    import transformers
    from safetensors.torch import load_file

    cases = []
    for family, hf_config in _tiny_configs().items():
        torch.manual_seed(len(cases))
        model = getattr(transformers, type(hf_config).__name__.replace("Config", "ForCausalLM"))(hf_config).eval()
        layers = model.model.layers
        with torch.no_grad():
            for name, p in layers.named_parameters():
                if ".mlp." in name:  # O(1) activations; router logits O(1) so top-k gaps are wide
                    p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]) * (3.0 if "gate.weight" in name else 1.0))
            for name, b in layers.named_buffers():
                if "e_score_correction_bias" in name:
                    b.copy_(torch.randn_like(b) * 0.3)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            saved = load_file(f"{tmp}/model.safetensors")
        kinds = [t == "sparse" for t in model_config(hf_config.to_dict())["mlp_layer_types"]]
        moe_layer, dense_layer = kinds.index(True), kinds.index(False)
        # the layer structure transformers built agrees with the config reader's mlp_layer_types
        assert [hasattr(layer.mlp, "experts") for layer in layers] == kinds, family
        inputs = [torch.randn(t, 32) for t in TOKENS]
        with torch.no_grad():
            refs = {layer: [layers[layer].mlp(x[None])[0] for x in inputs] for layer in (moe_layer, dense_layer)}
        mlp_tensors = {k: v for k, v in saved.items() if ".mlp." in k}
        cases.append(dict(family=family, config=hf_config.to_dict(), tensors=mlp_tensors, inputs=inputs,
                          refs=refs, layers=(moe_layer, dense_layer)))
    return tuple(cases)


# the expert GEMMs: the per-expert loop (the CPU reference) and the grouped GEMM that CUDA/NPU run
# (torch implements torch._grouped_mm on CPU as well); "alltoall" with the grouped GEMM: fixed capacity
MODES = (("allreduce", "loop"), ("allreduce", "grouped_mm"), ("alltoall", "loop"), ("alltoall", "grouped_mm"))


def _check_all(groups: ParallelGroups, cases) -> tuple[int, dict]:
    """Every case x dispatch mode x input on these groups; returns (checks, names read per block)."""
    checks, names = 0, {}
    for case in cases:
        for layer in case["layers"]:
            prefix = f"model.layers.{layer}.mlp."
            for dispatch, gemm in MODES:
                block = build_mlp(model_config(case["config"]), layer, groups, dispatch=dispatch)
                assert isinstance(block, MoE if layer == case["layers"][0] else DenseMLP)
                block.load_checkpoint(narrowing(case["tensors"].__getitem__), prefix)
                if isinstance(block, MoE):
                    block.experts.gemm = gemm
                names[(case["family"], layer, dispatch)] = block.checkpoint_names(prefix)
                for x, ref in zip(case["inputs"], case["refs"][layer]):
                    out = block(x.clone())
                    torch.testing.assert_close(out, ref, **TOL, msg=lambda m: f"{case['family']} {dispatch} {gemm} "
                                               f"T={x.shape[0]} tp={groups.tp.size} ep={groups.ep.size}: {m}")
                    checks += 1
                if isinstance(block, DenseMLP):
                    break  # dispatch does not apply
                assert block(torch.zeros(0, 32)).shape == (0, 32)  # an empty chunk skips the collectives
    return checks, names


def _parity_rank(rank, world_size, cases, eps):
    results = []
    for ep in eps:
        groups = initialize_model_parallel(world_size, 1, ep)
        results.append((ep, groups.ep.rank, groups.etp.rank, *_check_all(groups, cases)))
    return results


def _assert_names_cover_checkpoint(cases, names_per_rank):
    """Over the ranks, the names read are exactly the layer's checkpoint tensors (so a loader can
    report unexpected ones), and no rank reads another's experts."""
    for case in cases:
        for (family, layer, dispatch) in names_per_rank[0]:
            if family != case["family"]:
                continue
            prefix = f"model.layers.{layer}.mlp."
            expected = {k for k in case["tensors"] if k.startswith(prefix)}
            union = set().union(*(set(n[(family, layer, dispatch)]) for n in names_per_rank))
            assert union == expected, (family, layer, sorted(union ^ expected))


def test_parity_tp1():
    cases = _cases()
    checks, names = _check_all(ParallelGroups.single(), cases)
    assert checks == sum(len(TOKENS) * (len(MODES) + 1) for _ in cases)
    _assert_names_cover_checkpoint(cases, [names])
    # the tensor names that save_pretrained wrote, per family (the HF per-expert layout)
    for case in cases:
        prefix = f"model.layers.{case['layers'][0]}.mlp."
        kinds = {k[len(prefix):].split(".", 2)[-1] if ".experts." in k else k[len(prefix):]
                 for k in case["tensors"] if k.startswith(prefix)}
        shared = {f"shared_experts.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
        expected = {"gate.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight"}
        if case["family"] != "qwen3_moe":
            expected |= {"gate.e_score_correction_bias"} | shared
        assert kinds == expected, case["family"]


@pytest.mark.slow
@pytest.mark.parametrize("world_size, eps", [(2, (1, 2)), (4, (1, 2, 4))])
def test_parity_multi_rank(world_size, eps, worlds):
    cases = _cases()
    results = worlds.run(world_size, _parity_rank, cases, eps, timeout=180)
    for i, ep in enumerate(eps):
        per_rank = [r[i] for r in results]
        assert {(r[1], r[2]) for r in per_rank} == {(e, t) for e in range(ep) for t in range(world_size // ep)}
        assert all(r[3] == len(cases) * len(TOKENS) * (len(MODES) + 1) for r in per_rank)
        _assert_names_cover_checkpoint(cases, [r[4] for r in per_rank])
