"""The NPU's fused element-wise ops on CPU: a fake torch_npu enforces each op's documented contract
(torch_npu 2.13.0: dtypes, ranks, layouts, limits) and computes the result its own way; vpp's layers
routed to it must give what the reference path gives, and never call an op with what it refuses.
Each test also counts the fake's calls, so a layer that silently kept the reference would fail."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vpp.transformer import fused_ops
from vpp.transformer.attention.rope import apply_rope, apply_rope_interleaved
from vpp.transformer.basic import RMSNorm
from vpp.transformer.moe_config import MoEConfig
from vpp.transformer.router import Router

NPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class FakeNpu:
    def __init__(self):
        self.calls: dict[str, int] = {}

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def npu_rms_norm(self, x, gamma, epsilon=1e-6):
        self._count("rms_norm")
        assert x.dtype in NPU_DTYPES and gamma.dtype == x.dtype and 2 <= x.dim() <= 8, (x.dtype, gamma.dtype)
        rstd = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + epsilon)
        return (x.double() * rstd * gamma.double()).to(x.dtype), rstd.float()

    def npu_swiglu(self, x, dim=-1):
        self._count("swiglu")
        assert x.dtype in NPU_DTYPES and 1 <= x.dim() <= 8 and x.shape[dim] % 2 == 0
        a, b = x.double().chunk(2, dim=dim)
        return (a * torch.sigmoid(a) * b).to(x.dtype)

    def npu_rotary_mul(self, x, r1, r2, rotary_mode="half", rotate=None):
        self._count("rotary_mul")
        assert rotary_mode == "half" and rotate is None
        assert x.dim() == 4 and x.dtype in NPU_DTYPES and r1.dtype == r2.dtype == x.dtype
        b, s, n, d = x.shape  # BSND
        assert d % 2 == 0 and d < 896 and b < 1000 and n < 1000, x.shape
        assert r1.shape == r2.shape and r1.shape in ((1, s, 1, d), (b, s, 1, d), (b, s, n, d)), (r1.shape, x.shape)
        x1, x2 = x.double().chunk(2, dim=-1)
        return (r1.double() * x.double() + r2.double() * torch.cat((-x2, x1), dim=-1)).to(x.dtype)

    def npu_moe_gating_top_k_softmax(self, x, finished=None, k=1):
        self._count("gating_softmax")
        assert x.dim() in (2, 3) and x.dtype in NPU_DTYPES and 0 < k <= min(x.shape[-1], 1024) and finished is None
        values, ids = torch.softmax(x.double(), dim=-1).topk(k, dim=-1)
        rows = torch.arange(x.shape[0]).unsqueeze(-1).expand_as(ids)
        return values.to(x.dtype), ids.int(), rows.int()

    def npu_moe_gating_top_k(self, x, k, bias=None, input_ids=None, tid2eid=None, k_group=1, group_count=1,
                             group_select_mode=0, renorm=0, norm_type=0, out_flag=False,
                             routed_scaling_factor=1.0, eps=1e-20):
        self._count("gating_sigmoid")
        tokens, experts = x.shape  # 2-dim only
        assert x.dtype in NPU_DTYPES and experts <= 2048 and renorm == 0 and norm_type == 1
        assert bias is None or (bias.dim() == 1 and bias.shape[0] == experts and bias.dtype == x.dtype)
        assert group_count > 0 and experts % group_count == 0 and experts // group_count > 2
        assert -(-(experts // group_count) // 32) * 32 * group_count <= 2048
        assert 1 <= k_group <= group_count and 1 <= k <= experts // group_count * k_group
        scores = torch.sigmoid(x.double())
        choice = scores + (0 if bias is None else bias.double())
        grouped = choice.view(tokens, group_count, -1)
        if group_select_mode == 1:
            group_score = grouped.sort(dim=-1, descending=True).values[..., :2].sum(-1)
        else:
            group_score = grouped.amax(-1)
        keep = torch.zeros(tokens, group_count, dtype=torch.bool)
        keep.scatter_(1, group_score.argsort(dim=-1, descending=True, stable=True)[:, :k_group], True)
        choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(tokens, experts)
        ids = choice.argsort(dim=-1, descending=True, stable=True)[:, :k]
        y = scores.gather(1, ids)
        y = y / (y.sum(-1, keepdim=True) + eps) * routed_scaling_factor
        return y.to(x.dtype), ids.int(), None


@pytest.fixture
def fake(monkeypatch):
    npu = FakeNpu()
    monkeypatch.setattr(fused_ops, "npu_for", lambda x: npu)
    return npu


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm(fake, dtype):
    norm = RMSNorm(64, eps=1e-5, dtype=dtype)
    norm.weight.data = torch.rand(64, dtype=dtype) + 0.5
    x = torch.randn(7, 3, 64, dtype=dtype)
    got = norm(x)
    assert fake.calls == {"rms_norm": 1}
    with pytest.MonkeyPatch.context() as m:  # the same layer, routed to the reference
        m.setattr(fused_ops, "npu_for", lambda x: None)
        want = norm(x)
    torch.testing.assert_close(got, want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_both_ways(fake, dtype):
    gate, up = torch.randn(5, 32, dtype=dtype), torch.randn(5, 32, dtype=dtype)
    want = (F.silu(gate.float()) * up.float()).to(dtype)
    torch.testing.assert_close(fused_ops.gated(F.silu, gate, up), want, **TOL[dtype])
    torch.testing.assert_close(fused_ops.gated_halves(F.silu, torch.cat((gate, up), -1)), want, **TOL[dtype])
    assert fake.calls == {"swiglu": 2}
    fused_ops.gated(F.gelu, gate, up)  # no fused GeGLU: the two ops, no call
    assert fake.calls == {"swiglu": 2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotate", [apply_rope, apply_rope_interleaved])
def test_rotary_embeddings(fake, dtype, rotate):
    x = torch.randn(6, 4, 32, dtype=dtype)
    angles = torch.rand(6, 16) * 6
    cos, sin = torch.cat((angles, angles), -1).cos().to(dtype), torch.cat((angles, angles), -1).sin().to(dtype)
    got = rotate(x, cos, sin)
    assert fake.calls == {"rotary_mul": 1}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fused_ops, "npu_for", lambda x: None)
        want = rotate(x, cos, sin)
    torch.testing.assert_close(got, want, **TOL[dtype])


def test_rotary_wider_than_the_op_takes_runs_the_reference(fake):
    x = torch.randn(2, 2, 896)
    cos, sin = torch.ones(2, 896), torch.zeros(2, 896)
    torch.testing.assert_close(apply_rope(x, cos, sin), x)
    assert fake.calls == {}


def _router(cfg: MoEConfig, seed: int = 0) -> Router:
    g = torch.Generator().manual_seed(seed)
    router = Router(cfg)
    router.weight.data = torch.randn(cfg.num_experts, cfg.hidden_size, generator=g)
    if router.e_score_correction_bias is not None:
        router.e_score_correction_bias.data = torch.randn(cfg.num_experts, generator=g) * 0.1
    return router


CONFIGS = {
    "qwen-softmax": dict(num_experts=16, top_k=4, scoring="softmax", norm_topk_prob=True),
    "softmax-unnormalised": dict(num_experts=8, top_k=2, scoring="softmax", norm_topk_prob=False),
    "deepseek-groups": dict(num_experts=32, top_k=4, scoring="sigmoid", n_group=4, topk_group=2,
                            correction_bias=True, routed_scaling_factor=2.5, norm_topk_prob=True),
    "deepseek-one-group": dict(num_experts=16, top_k=3, scoring="sigmoid", correction_bias=True, norm_topk_prob=True),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_router_gating(fake, name):
    cfg = MoEConfig(hidden_size=24, moe_intermediate_size=8, **CONFIGS[name])
    router = _router(cfg)
    x = torch.randn(11, 24)
    weights, ids = router(x)
    assert fake.calls == {"gating_softmax" if cfg.scoring == "softmax" else "gating_sigmoid": 1}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fused_ops, "npu_for", lambda x: None)
        want_w, want_ids = router(x)
    assert torch.equal(ids, want_ids) and ids.dtype == torch.int64
    torch.testing.assert_close(weights, want_w, rtol=1e-5, atol=1e-6)


def test_sigmoid_gating_the_op_refuses_runs_the_reference(fake):
    # two experts per group: npu_moe_gating_top_k needs more than two
    cfg = MoEConfig(hidden_size=8, moe_intermediate_size=4, num_experts=8, top_k=2, scoring="sigmoid", n_group=4,
                    topk_group=2, correction_bias=True)
    _router(cfg)(torch.randn(3, 8))
    assert fake.calls == {}


@pytest.mark.parametrize("experts, k, groups, kept, ok", [
    (256, 8, 8, 4, True),       # DeepSeek-V3
    (16, 3, 1, 1, True),
    (8, 2, 4, 2, False),        # two experts per group
    (4096, 8, 8, 4, False),     # more than 2048 experts
    (64, 40, 8, 4, False),      # k beyond the kept groups' experts
    (1536, 8, 48, 4, True),     # 32 per group, 32-aligned: 48 x 32 = 1536 <= 2048
    (2000, 8, 40, 4, False),    # 50 per group, 32-aligned 64: 40 x 64 = 2560 > 2048
])
def test_npu_gating_limits(experts, k, groups, kept, ok):
    assert fused_ops.npu_gating_ok(experts, k, groups, kept) is ok


def test_off_an_npu_nothing_is_routed():
    assert fused_ops.npu_for(torch.zeros(1)) is None
