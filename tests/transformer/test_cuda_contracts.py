"""The CUDA kernels' arguments, on CPU: no GPU runs here, so fakes stand in for what vpp calls on CUDA
and enforce each op's contract as torch documents and implements it (torch 2.9-2.13):

- ``F.scaled_dot_product_attention`` (the causal kernel, ``kernel._sdpa``): a fused kernel must be
  eligible, never the math fallback that materialises an [Lq, Lk] mask: ``is_causal`` only on a square
  block (torch's flag is top-left aligned), a lower-right ``CausalBias`` otherwise, served by flash
  (16 bits, one head width <= 256, a multiple of 8; grouped heads allowed) or by the memory-efficient
  kernel (equal head counts, one width aligned to 16 bytes); no dense mask tensor.
- ``aten._scaled_dot_product_flash_attention`` / ``aten._scaled_dot_product_efficient_attention`` (the
  piece kernel with its log-sum-exp, ``kernel._cuda_lse``): 4-D [B, H, L, D], equal head counts and
  widths; flash in 16 bits only, width <= 256; the efficient kernel's log-sum-exp padded to a multiple
  of 32 queries (the fake fills the padding with NaN, so a caller that keeps it fails); ``is_causal``
  only on square blocks.
- ``torch._grouped_mm`` (the expert GEMMs, ``GroupedExperts.grouped`` with ``gemm="grouped_mm"``):
  bf16, a [M, K] by [G, K, N] with the second operand K-major (stride 1 along K), int32 cumulative
  ``offs`` of length G, K and N multiples of 8 (16-byte rows); rows past ``offs[-1]`` are undefined
  (NaN here).

Each fake computes its result independently (explicit fp32 scores, one mm per group), and every test
compares vpp's output with an independent reference, so the tests fail if vpp calls an op with
arguments it refuses or uses its outputs wrongly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias, CausalVariant

from vpp.transformer.attention import kernel as kernel_module
from vpp.transformer.expert_gemm import GroupedExperts


def reference(q, k, v, scale, causal=True):
    """Explicit fp32 softmax, bottom-right causal (query i sees keys 0..Lk-Lq+i), grouped heads by
    repetition; q [Hq, Lq, D], k [Hk, Lk, D], v [Hk, Lk, Dv] -> (out [Hq, Lq, Dv], lse [Hq, Lq])."""
    group = q.shape[0] // k.shape[0]
    k, v = k.float().repeat_interleave(group, 0), v.float().repeat_interleave(group, 0)
    lq, lk = q.shape[1], k.shape[1]
    s = (q.float() @ k.transpose(1, 2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(lk - lq + 1), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def _aligned(width: int, dtype: torch.dtype) -> bool:
    return width % (16 // torch.empty((), dtype=dtype).element_size()) == 0


class FakeSdpa:
    """``F.scaled_dot_product_attention`` on CUDA, as its dispatcher picks a kernel; refuses any call
    that would leave the fused kernels (the math path, which materialises the mask)."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        assert q.dim() == k.dim() == v.dim() == 4 and dropout_p == 0.0
        assert q.dtype == k.dtype == v.dtype
        hq, hk, lq, lk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
        width = q.shape[-1]
        assert k.shape[-1] == v.shape[-1] == width, f"widths {q.shape[-1]}/{k.shape[-1]}/{v.shape[-1]}: math path"
        assert (hq != hk) == enable_gqa and hq % hk == 0, (hq, hk, enable_gqa)
        if is_causal:
            assert attn_mask is None and lq == lk, f"is_causal is top-left aligned: only a square block ({lq}x{lk})"
            kernel = "flash" if q.dtype != torch.float32 and width <= 256 else "efficient"
        else:
            assert not isinstance(attn_mask, torch.Tensor) or isinstance(attn_mask, CausalBias), \
                "a dense mask tensor: the math path"
            assert isinstance(attn_mask, CausalBias) and attn_mask.variant == CausalVariant.LOWER_RIGHT
            assert (attn_mask.seq_len_q, attn_mask.seq_len_kv) == (lq, lk)
            if q.dtype in (torch.float16, torch.bfloat16) and width <= 256 and width % 8 == 0:
                kernel = "flash"
            else:
                assert hq == hk, "the efficient kernel cannot group heads: with enable_gqa the mask is materialised"
                assert _aligned(width, q.dtype), f"width {width} not 16-byte aligned"
                kernel = "efficient"
        self.calls.append((kernel, q.dtype, hq, hk, lq, lk, width))
        out, _ = reference(q[0], k[0], v[0], scale)
        return out.to(q.dtype)[None]


class FakeAten:
    """The two fused piece kernels of ``torch.ops.aten`` with their outputs' layout."""

    def __init__(self):
        self.calls = []

    @staticmethod
    def _check(q, k, v, causal):
        assert q.dim() == k.dim() == v.dim() == 4 and q.dtype == k.dtype == v.dtype
        assert q.shape[1] == k.shape[1] == v.shape[1], "the raw kernels take equal head counts"
        assert q.shape[-1] == k.shape[-1] == v.shape[-1], "one head width"
        assert not causal or q.shape[2] == k.shape[2], "is_causal is top-left aligned: only a square block"

    def _scaled_dot_product_flash_attention(self, q, k, v, dropout_p=0.0, is_causal=False,
                                            return_debug_mask=False, *, scale=None):
        self._check(q, k, v, is_causal)
        assert q.dtype in (torch.float16, torch.bfloat16), f"flash takes 16 bits, got {q.dtype}"
        assert q.shape[-1] <= 256 and q.shape[-1] % 8 == 0, f"flash width {q.shape[-1]}"
        self.calls.append(("flash", q.dtype, tuple(q.shape)))
        out, lse = reference(q[0], k[0], v[0], scale, causal=is_causal)
        return (out.to(q.dtype)[None], lse[None], None, None, q.shape[2], k.shape[2],
                torch.tensor(0), torch.tensor(0), torch.empty(0))

    def _scaled_dot_product_efficient_attention(self, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0,
                                                is_causal=False, *, scale=None):
        self._check(q, k, v, is_causal)
        assert attn_bias is None and compute_log_sumexp
        assert _aligned(q.shape[-1], q.dtype), f"width {q.shape[-1]} not 16-byte aligned"
        self.calls.append(("efficient", q.dtype, tuple(q.shape)))
        out, lse = reference(q[0], k[0], v[0], scale, causal=is_causal)
        lq = q.shape[2]
        padded = torch.full((1, q.shape[1], -(-lq // 32) * 32), float("nan"))
        padded[0, :, :lq] = lse
        return out.to(q.dtype)[None], padded, torch.tensor(0), torch.tensor(0)


# (q heads, kv heads, q/k width, v width): GQA 8/2 x 64 (Qwen3), MLA 96 -> 64 (DeepSeek's 64 + 32 rope,
# value 64), and a width past flash's 256 (MLA at full size: 192 / 128 is within; 288 is not)
SHAPES = [(8, 2, 64, 64), (4, 4, 96, 64), (2, 2, 288, 288)]
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def _qkv(hq, hk, d, dv, lq, lk, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(hq, lq, d, generator=g).to(dtype), torch.randn(hk, lk, d, generator=g).to(dtype),
            torch.randn(hk, lk, dv, generator=g).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq, hk, d, dv", SHAPES)
@pytest.mark.parametrize("lq, lk", [(48, 48), (48, 112), (1, 70)])
def test_cuda_causal_kernel_keeps_to_fused_sdpa(monkeypatch, dtype, hq, hk, d, dv, lq, lk):
    fake = FakeSdpa()
    monkeypatch.setattr(F, "scaled_dot_product_attention", fake)
    q, k, v = _qkv(hq, hk, d, dv, lq, lk, dtype)
    scale = d ** -0.5
    out = kernel_module._sdpa(q, k, v, scale)
    ref, _ = reference(q, k, v, scale)
    assert out.shape == (hq, lq, dv) and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])
    kernel, *_ = fake.calls[0]
    route = kernel_module.sdpa_route(dtype, max(d, dv), hq, hk, lq, lk)
    assert kernel == ("flash" if route == "flash" or (route == "causal" and dtype != torch.float32
                                                        and max(d, dv) <= 256) else "efficient")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq, hk, d, dv", [s for s in SHAPES if s[0] == s[1]])
@pytest.mark.parametrize("lq, lk, causal", [(40, 40, True), (40, 100, False), (33, 33, True)])
def test_cuda_piece_kernel_returns_unpadded_lse(monkeypatch, dtype, hq, hk, d, dv, lq, lk, causal):
    """The pieces that ring attention and the prefix split merge: output and log-sum-exp equal the
    reference, the efficient kernel's padded log-sum-exp cut to the queries (NaN beyond)."""
    fake = FakeAten()
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"):
        monkeypatch.setattr(torch.ops.aten, name, getattr(fake, name))
    q, k, v = _qkv(hq, hk, d, dv, lq, lk, dtype, seed=1)
    scale = d ** -0.5
    out, lse = kernel_module._cuda_lse(q, k, v, scale, causal)
    ref, ref_lse = reference(q, k, v, scale, causal=causal)
    assert out.shape == (hq, lq, dv) and lse.shape == (hq, lq)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(lse, ref_lse, atol=TOL[dtype], rtol=TOL[dtype])
    want = "flash" if dtype == torch.bfloat16 and max(d, dv) <= 256 else "efficient"
    assert [c[0] for c in fake.calls] == [want]


def test_the_fakes_catch_a_caller_that_breaks_the_contract(monkeypatch):
    """The fakes bite: a dense mask, is_causal off the square, grouped heads on the raw kernels and the
    padded log-sum-exp kept are each caught."""
    fake = FakeSdpa()
    q, k, v = _qkv(8, 2, 64, 64, 16, 40, torch.float32)
    dense = torch.ones(16, 40, dtype=torch.bool).tril(24)
    with pytest.raises(AssertionError, match="dense mask"):
        fake(q[None], k.repeat_interleave(4, 0)[None], v.repeat_interleave(4, 0)[None], attn_mask=dense)
    with pytest.raises(AssertionError, match="top-left"):
        fake(q[None], k[None], v[None], is_causal=True, enable_gqa=True)
    with pytest.raises(AssertionError, match="cannot group heads"):
        fake(q[None], k[None], v[None], attn_mask=CausalBias(CausalVariant.LOWER_RIGHT, 16, 40), enable_gqa=True)
    aten = FakeAten()
    with pytest.raises(AssertionError, match="equal head counts"):
        aten._scaled_dot_product_efficient_attention(q[None], k[None], v[None], None, True)
    q4, k4, v4 = _qkv(4, 4, 64, 64, 20, 20, torch.float32)
    _, lse, *_ = aten._scaled_dot_product_efficient_attention(q4[None], k4[None], v4[None], None, True)
    assert lse.shape[-1] == 32 and lse[0, :, 20:].isnan().all()


class FakeGroupedMm:
    """``torch._grouped_mm(a, b, offs=...)`` where a fused kernel runs (bf16 on sm90/sm100)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, a, b, offs=None, bias=None, out_dtype=None):
        assert a.dtype == b.dtype == torch.bfloat16, f"the fused grouped GEMM takes bf16, got {a.dtype}/{b.dtype}"
        assert a.dim() == 2 and b.dim() == 3 and bias is None
        groups, kk, n = b.shape
        assert a.shape[1] == kk, (a.shape, b.shape)
        assert kk % 8 == 0 and n % 8 == 0, f"K={kk}, N={n}: rows must be 16-byte aligned"
        assert b.stride(-2) == 1, f"the second operand must be K-major, strides {b.stride()}"
        assert offs is not None and offs.dtype == torch.int32 and offs.shape == (groups,), offs
        ends = offs.tolist()
        assert all(x <= y for x, y in zip([0] + ends, ends)) and ends[-1] <= a.shape[0], ends
        self.calls += 1
        out = torch.full((a.shape[0], n), float("nan"))
        start = 0
        for g, end in enumerate(ends):
            out[start:end] = a[start:end].float() @ b[g].float()
            start = end
        return out.to(torch.bfloat16)


@pytest.mark.parametrize("tail", [0, 5])
def test_cuda_grouped_expert_gemm_keeps_to_grouped_mm(monkeypatch, tail):
    """bf16 experts on the grouped GEMM (an empty expert among them; ``tail`` rows for other EP ranks'
    experts) equal each expert's MLP written out in fp32 on the same bf16 weights."""
    experts, hidden, inter = 6, 16, 24
    g = torch.Generator().manual_seed(3)
    counts = torch.randint(1, 5, (experts,), generator=g)
    counts[2] = 0
    block = GroupedExperts(experts, hidden, inter, "silu", dtype=torch.bfloat16, gemm="grouped_mm")
    with torch.no_grad():
        block.gate_up_proj.copy_(torch.randn(block.gate_up_proj.shape, generator=g) / 4)
        block.down_proj.copy_(torch.randn(block.down_proj.shape, generator=g) / 4)
    fake = FakeGroupedMm()
    monkeypatch.setattr(torch, "_grouped_mm", fake)
    done = int(counts.sum())
    x = torch.randn(done + tail, hidden, generator=g).to(torch.bfloat16)
    out = block.grouped(x, counts.cumsum(0))
    assert fake.calls == 2 and out.dtype == torch.bfloat16
    ref, start = torch.empty(done, hidden), 0
    for e, n in enumerate(counts.tolist()):
        rows = x[start:start + n].float()
        gate, up = rows @ block.gate_up_proj[e, :inter].float().T, rows @ block.gate_up_proj[e, inter:].float().T
        ref[start:start + n] = (F.silu(gate) * up) @ block.down_proj[e].float().T
        start += n
    assert not out[:done].isnan().any()
    torch.testing.assert_close(out[:done].float(), ref, atol=5e-2, rtol=5e-2)


def test_grouped_mm_fake_refuses_fp32_and_a_row_major_weight():
    fake = FakeGroupedMm()
    offs = torch.tensor([4, 8], dtype=torch.int32)
    with pytest.raises(AssertionError, match="bf16"):
        fake(torch.randn(8, 16), torch.randn(2, 16, 8), offs=offs)
    with pytest.raises(AssertionError, match="K-major"):
        fake(torch.randn(8, 16).bfloat16(), torch.randn(2, 16, 8).bfloat16(), offs=offs)
