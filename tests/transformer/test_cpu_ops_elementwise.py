"""vpp's one-pass CPU RMSNorm and half rotation (vpp.transformer.cpu_ops) against independent references,
and their routing from vpp.transformer.fused_ops."""

from __future__ import annotations

import pytest
import torch

from vpp.transformer import cpu_ops, fused_ops

needs_kernel = pytest.mark.skipif(cpu_ops.library() is None, reason=f"vpp's CPU ops cannot run here: "
                                                                     f"{cpu_ops.unavailable_reason()}")


def rms_reference(x, w, eps):  # float64, written out
    x64 = x.double()
    return (w.double() * x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps)).float()


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 16), (37, 100), (5, 3, 64), (2, 7)])  # widths with and without a 16-lane tail
def test_rms_norm_equals_the_float64_formula(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x, w = torch.randn(*shape, generator=gen) * 3, torch.randn(shape[-1], generator=gen)
    got = cpu_ops.rms_norm(x, w, 1e-6)
    want = rms_reference(x, w, 1e-6)
    assert got.shape == x.shape and got.dtype == torch.float32
    assert float((got - want).abs().max()) <= 4e-6 * float(want.abs().max())


@needs_kernel
def test_rms_norm_keeps_a_nan_in_its_row_and_eps_matters():
    x, w = torch.randn(4, 40), torch.ones(40)
    x[2, 5] = float("nan")
    got = cpu_ops.rms_norm(x, w, 1e-6)
    assert got[2].isnan().all() and not got[[0, 1, 3]].isnan().any()
    zero = cpu_ops.rms_norm(torch.zeros(1, 32), w[:32], 0.25)
    assert torch.equal(zero, torch.zeros(1, 32))  # 0 * 1 / sqrt(0 + eps)
    tiny = torch.full((1, 32), 1e-3)
    assert torch.allclose(cpu_ops.rms_norm(tiny, w[:32], 1.0), tiny / (1 + 1e-6) ** 0.5, rtol=1e-6)


@needs_kernel
@pytest.mark.parametrize("heads,d", [(8, 64), (2, 128), (3, 40), (1, 2)])
def test_rotate_half_is_bitwise_the_reference(heads, d):
    gen = torch.Generator().manual_seed(d)
    x = torch.randn(29, heads, d, generator=gen)
    cos, sin = torch.randn(29, d, generator=gen), torch.randn(29, d, generator=gen)
    half = d // 2
    want = x * cos[:, None] + torch.cat((-x[..., half:], x[..., :half]), -1) * sin[:, None]
    assert torch.equal(cpu_ops.rotate_half(x, cos, sin), want)
    strided = torch.randn(29, heads, d + 24, generator=gen)[..., :d]  # a view: rows not adjacent
    want = strided * cos[:, None] + torch.cat((-strided[..., half:], strided[..., :half]), -1) * sin[:, None]
    assert torch.equal(cpu_ops.rotate_half(strided, cos, sin), want)


def test_what_the_kernels_decline_goes_to_the_reference(monkeypatch):
    x, w = torch.randn(6, 32), torch.randn(32)
    assert cpu_ops.rms_norm(x.double(), w.double(), 1e-6) is None
    assert cpu_ops.rms_norm(x.t(), w[:6], 1e-6) is None  # not contiguous
    assert cpu_ops.rotate_half(torch.randn(4, 2, 7), torch.randn(4, 7), torch.randn(4, 7)) is None  # odd width
    assert cpu_ops.rotate_half(torch.randn(4, 2, 8).bfloat16(), torch.randn(4, 8), torch.randn(4, 8)) is None
    monkeypatch.setenv("VPP_CPU_OPS", "torch")
    assert cpu_ops.rms_norm(x, w, 1e-6) is None
    monkeypatch.setenv("VPP_CPU_OPS", "bogus")
    with pytest.raises(ValueError, match="VPP_CPU_OPS='bogus' is not one of"):
        cpu_ops.rotate_half(torch.randn(4, 2, 8), torch.randn(4, 8), torch.randn(4, 8))


@needs_kernel
def test_fused_ops_route_fp32_cpu_tensors_to_the_kernels(monkeypatch):
    x, w = torch.randn(6, 32), torch.randn(32)
    calls = []
    real_norm, real_rot = cpu_ops.rms_norm, cpu_ops.rotate_half
    monkeypatch.setattr(cpu_ops, "rms_norm", lambda *a: calls.append("norm") or real_norm(*a))
    monkeypatch.setattr(cpu_ops, "rotate_half", lambda *a: calls.append("rot") or real_rot(*a))
    monkeypatch.setenv("VPP_CPU_OPS", "auto")
    fast = fused_ops.rms_norm(x, w, 1e-6), fused_ops.rotate_half(torch.ones(3, 2, 8), torch.ones(3, 8), torch.ones(3, 8))
    assert calls == ["norm", "rot"]
    monkeypatch.setenv("VPP_CPU_OPS", "torch")
    slow = fused_ops.rms_norm(x, w, 1e-6), fused_ops.rotate_half(torch.ones(3, 2, 8), torch.ones(3, 8), torch.ones(3, 8))
    assert torch.allclose(fast[0], slow[0], rtol=2e-6, atol=1e-7) and torch.equal(fast[1], slow[1])
