"""The NPU kernels' arguments, on CPU: torch_npu is not installable here, so fakes stand in for
``npu_fusion_attention`` and ``npu_grouped_matmul`` that enforce the documented contract (and the
older releases' limits) and compute the result independently (explicit fp32 scores, per-group mm).
The tests fail if vpp calls either op with arguments it refuses, or gets a different result than the
independent reference."""

from __future__ import annotations

import math

import pytest
import torch

from vpp.transformer import expert_gemm as expert_gemm_module
from vpp.transformer.attention import kernel as kernel_module
from vpp.transformer.attention.kernel import npu_attention_route
from vpp.transformer.expert_gemm import GroupedExperts, npu_gmm_calls, npu_grouped_mm


def reference_attention(q, k, v, scale):
    """Explicit fp32 softmax with the bottom-right causal mask (query i sees keys 0..Lk-Lq+i), grouped
    heads by repetition; returns (out [Hq, Lq, Dv], lse [Hq, Lq])."""
    group = q.shape[0] // k.shape[0]
    k, v = k.float().repeat_interleave(group, 0), v.float().repeat_interleave(group, 0)
    lq, lk = q.shape[1], k.shape[1]
    s = (q.float() @ k.transpose(1, 2)) * scale
    hidden = torch.ones(lq, lk, dtype=torch.bool).triu(lk - lq + 1)
    s = s.masked_fill(hidden, float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


class FakeFusionAttention:
    """``npu_fusion_attention`` as documented, with older CANN's limits: 16-bit inputs, one head width
    for q/k/v, a multiple of 16 and at most 512; BNSD; key heads dividing query heads; sparse_mode 0
    (no mask) or 3 (bottom-right causal with the compressed 2048 x 2048 upper-triangular mask)."""

    def __init__(self):
        self.calls = []

    def npu_fusion_attention(self, q, k, v, head_num, layout, *, atten_mask=None, scale=1.0, sparse_mode=0):
        assert layout == "BNSD" and q.dim() == k.dim() == v.dim() == 4, layout
        assert q.dtype in (torch.float16, torch.bfloat16) and k.dtype == v.dtype == q.dtype, q.dtype
        width = q.shape[-1]
        assert k.shape[-1] == v.shape[-1] == width, (q.shape, k.shape, v.shape)
        assert width % 16 == 0 and width <= 512, f"head width {width} refused"
        assert head_num == q.shape[1] and q.shape[1] % k.shape[1] == 0, (head_num, q.shape, k.shape)
        assert sparse_mode in (0, 3), sparse_mode
        lq, lk = q.shape[2], k.shape[2]
        if sparse_mode == 3:
            assert atten_mask is not None and atten_mask.dtype == torch.bool and atten_mask.shape == (2048, 2048)
            assert torch.equal(atten_mask.cpu(), torch.ones(2048, 2048, dtype=torch.bool).triu(1))
        self.calls.append((tuple(q.shape), q.dtype, sparse_mode))
        group = q.shape[1] // k.shape[1]
        kk, vv = k[0].float().repeat_interleave(group, 0), v[0].float().repeat_interleave(group, 0)
        s = (q[0].float() @ kk.transpose(1, 2)) * scale
        if sparse_mode == 3:
            s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(lk - lq + 1), float("-inf"))
        smax = s.amax(-1, keepdim=True)
        ssum = (s - smax).exp().sum(-1, keepdim=True)
        out = ((s - smax).exp() / ssum) @ vv
        return out.to(q.dtype)[None], smax.expand(*smax.shape[:-1], 8)[None], ssum.expand(*ssum.shape[:-1], 8)[None], \
            None, 0, 0, 0


@pytest.mark.parametrize("dtype, width, expected", [
    (torch.bfloat16, 24, ("fused", 32)),     # a tiny MLA width: padded to 32
    (torch.float16, 96, ("fused", 96)),
    (torch.bfloat16, 512, ("fused", 512)),
    (torch.bfloat16, 520, ("math", 520)),    # pads past 512
    (torch.bfloat16, 576, ("math", 576)),    # DeepSeek's MLA 192 fits; 576 (absorbed MLA) does not
    (torch.float32, 64, ("math", 64)),       # older CANN: 16-bit inputs only
])
def test_npu_attention_route(dtype, width, expected):
    assert npu_attention_route(dtype, width) == expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hq, hk, lq, lk, d, dv", [
    (4, 4, 8, 8, 24, 16),     # square, the tiny MLA widths (24 query/key, 16 value)
    (4, 2, 8, 20, 24, 24),    # after a prefix, grouped heads
    (2, 2, 5, 13, 600, 600),  # a width the op refuses at any dtype
])
def test_npu_causal_kernel_never_passes_a_refused_argument(monkeypatch, dtype, hq, hk, lq, lk, d, dv):
    fake = FakeFusionAttention()
    monkeypatch.setattr(kernel_module, "_torch_npu", lambda: fake)
    g = torch.Generator().manual_seed(lq * lk + d)
    q, k = torch.randn(hq, lq, d, generator=g), torch.randn(hk, lk, d, generator=g)
    v = torch.randn(hk, lk, dv, generator=g)
    scale = 1 / math.sqrt(d)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    ref, _ = reference_attention(q, k, v, scale)
    out = kernel_module._npu_causal(q, k, v, scale)
    assert out.shape == (hq, lq, dv) and out.dtype == dtype
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.float(), ref, **tol)
    fused = npu_attention_route(dtype, max(d, dv))[0] == "fused"
    assert (len(fake.calls) == 1) == fused, fake.calls  # refused cases never reach the op


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_npu_lse_pieces(monkeypatch, dtype, causal):
    fake = FakeFusionAttention()
    monkeypatch.setattr(kernel_module, "_torch_npu", lambda: fake)
    g = torch.Generator().manual_seed(7)
    lq, lk = 9, 9 if causal else 30
    q, k, v = (torch.randn(3, n, 24, generator=g).to(dtype) for n in (lq, lk, lk))
    out, lse = kernel_module._npu_lse(q, k, v, 0.3, causal)
    # the reference: a causal piece is square (top-left = bottom-right), a non-causal one sees every key
    ref, ref_lse = reference_attention(q, k, v, 0.3) if causal else _full(q, k, v, 0.3)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.float(), ref, **tol)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)
    assert len(fake.calls) == (1 if dtype == torch.bfloat16 else 0)


def _full(q, k, v, scale):
    s = (q.float() @ k.float().transpose(1, 2)) * scale
    return torch.softmax(s, -1) @ v.float(), torch.logsumexp(s, -1)


class FakeGroupedMatmul:
    """``npu_grouped_matmul`` as documented, one x and one weight, groups along M: x [M, K]; weight
    [G, K, N] (contiguous, or the transposed view of a contiguous [G, N, K]); ``group_list`` int64 [G],
    cumulative row counts, non-decreasing, last <= M; split_item 2 (one output [M, N]); at most
    ``max_groups`` groups (older releases: 128). Rows past ``group_list[-1]`` come back as NaN: the
    op leaves them undefined."""

    def __init__(self, max_groups=128):
        self.max_groups, self.calls = max_groups, []

    def npu_grouped_matmul(self, x, weight, *, group_list, split_item, group_type, group_list_type):
        assert isinstance(x, list) and isinstance(weight, list) and len(x) == len(weight) == 1
        (a,), (w,) = x, weight
        assert a.dim() == 2 and w.dim() == 3 and w.shape[1] == a.shape[1], (a.shape, w.shape)
        assert w.is_contiguous() or w.transpose(1, 2).is_contiguous(), w.stride()
        assert (split_item, group_type, group_list_type) == (2, 0, 0), (split_item, group_type, group_list_type)
        assert torch.is_tensor(group_list) and group_list.dtype == torch.int64 and group_list.shape == (w.shape[0],)
        assert w.shape[0] <= self.max_groups, f"{w.shape[0]} groups > {self.max_groups}"
        bounds = [0] + group_list.tolist()
        assert all(b0 <= b1 for b0, b1 in zip(bounds, bounds[1:])) and bounds[-1] <= a.shape[0], bounds
        self.calls.append(w.shape[0])
        out = torch.full((a.shape[0], w.shape[2]), float("nan"), dtype=a.dtype)
        for e, (b0, b1) in enumerate(zip(bounds, bounds[1:])):
            out[b0:b1] = a[b0:b1] @ w[e]
        return [out]


@pytest.mark.parametrize("groups, limit, calls", [(8, 128, [(0, 8)]), (256, 128, [(0, 128), (128, 256)]),
                                                  (129, 128, [(0, 64), (64, 129)]), (5, 2, [(0, 1), (1, 3), (3, 5)])])
def test_npu_gmm_calls(groups, limit, calls):
    assert npu_gmm_calls(groups, limit) == calls
    with pytest.raises(ValueError, match="0"):
        npu_gmm_calls(0)


@pytest.mark.parametrize("experts, limit, tail", [(8, 128, 0), (256, 128, 0), (256, 128, 37), (9, 4, 5)])
def test_npu_grouped_mm_matches_the_per_expert_loop(monkeypatch, experts, limit, tail):
    """256 local experts (DeepSeek at EP 1) in calls of <= 128; ``tail`` rows past the last expert's
    segment (EP > 1: other ranks' pairs) are left undefined and every other row is exact."""
    g = torch.Generator().manual_seed(experts + tail)
    counts = torch.randint(0, 4, (experts,), generator=g)
    counts[experts // 2] = 0  # an empty segment
    m = int(counts.sum()) + tail
    block = GroupedExperts(experts, 16, 12, "silu", gemm="npu")
    with torch.no_grad():
        block.gate_up_proj.copy_(torch.randn(block.gate_up_proj.shape, generator=g) / 4)
        block.down_proj.copy_(torch.randn(block.down_proj.shape, generator=g) / 4)
    fake = FakeGroupedMatmul(limit)
    monkeypatch.setattr(expert_gemm_module, "_torch_npu", lambda: fake)
    monkeypatch.setattr(expert_gemm_module, "NPU_GMM_MAX_GROUPS", limit)
    x = torch.randn(m, 16, generator=g)
    ends = counts.cumsum(0)
    out = block.grouped(x, ends)
    # the independent reference: each expert's MLP on its rows, written out
    done = int(counts.sum())
    ref = torch.empty(done, 16)
    start = 0
    for e, n in enumerate(counts.tolist()):
        rows = x[start:start + n]
        gate = rows @ block.gate_up_proj[e, :12].T
        up = rows @ block.gate_up_proj[e, 12:].T
        ref[start:start + n] = (torch.nn.functional.silu(gate) * up) @ block.down_proj[e].T
        start += n
    torch.testing.assert_close(out[:done], ref, atol=1e-5, rtol=1e-5)
    assert len(fake.calls) == 2 * len(npu_gmm_calls(experts, limit))  # two projections
    assert max(fake.calls) <= limit


def test_npu_grouped_mm_direct_call_counts():
    fake = FakeGroupedMatmul(128)
    w = torch.randn(256, 6, 4)
    ends = torch.arange(1, 257)
    out = npu_grouped_mm(fake, torch.randn(256, 4), w, ends)
    assert out.shape == (256, 6) and fake.calls == [128, 128] and not out.isnan().any()
