"""What runs on a device, decided on CPU from the device's facts: bf16 by default on accelerators, no
float32 expert GEMM that syncs the host, and no attention path that materialises a causal mask."""

import math

import pytest
import torch
from torch.nn.attention.bias import CausalBias

import vpp.transformer.attention.kernel as kernel
from vpp.models.registry import resolve_dtype
from vpp.transformer.expert_gemm import choose_expert_gemm

H200 = dict(capability=(9, 0), torch_version=(2, 11), has_grouped_mm=True)


@pytest.mark.parametrize("facts,dtype,want", [
    (H200, torch.bfloat16, "grouped_mm"),
    (dict(H200, capability=(10, 0)), torch.bfloat16, "grouped_mm"),
    (dict(H200, capability=(8, 0)), torch.bfloat16, "loop"),  # A100: no fused kernel, one host read per layer
    (dict(H200, torch_version=(2, 8)), torch.bfloat16, "loop"),
    (dict(H200, has_grouped_mm=False), torch.float16, "loop"),
])
def test_expert_gemm_on_cuda(facts, dtype, want):
    assert choose_expert_gemm("cuda", dtype, **facts) == want


@pytest.mark.parametrize("facts", [H200, dict(H200, capability=(8, 0)), dict(H200, torch_version=(2, 8))])
def test_float32_experts_on_cuda_are_refused_in_one_line(facts):
    with pytest.raises(ValueError, match=r"float32 MoE experts on CUDA .*run the model in bfloat16") as info:
        choose_expert_gemm("cuda", torch.float32, **facts)
    assert "\n" not in str(info.value)


def test_expert_gemm_elsewhere():
    assert choose_expert_gemm("cpu", torch.float32) == "loop"
    assert choose_expert_gemm("npu", torch.bfloat16, has_npu_gmm=True) == "npu"
    assert choose_expert_gemm("npu", torch.bfloat16, has_npu_gmm=False) == "loop"


@pytest.mark.parametrize("model", ["tiny-deepseek", "tiny-qwen", "tiny-glm", "toy"])
def test_auto_dtype_is_bf16_on_accelerators_and_float32_on_cpu(model):
    assert resolve_dtype(model, "auto", device_kind="cuda") == torch.bfloat16
    assert resolve_dtype(model, "auto", device_kind="npu") == torch.bfloat16
    assert resolve_dtype(model, "auto") == torch.float32
    assert resolve_dtype(model, "float32", device_kind="cuda") == torch.float32  # asked for: kept


@pytest.mark.parametrize("dtype,width,hq,hk,lq,lk,want", [
    (torch.float32, 64, 8, 2, 16, 16, "causal"),
    (torch.bfloat16, 128, 8, 2, 16, 48, "flash"),
    (torch.float32, 64, 8, 2, 16, 48, "expand-kv"),  # the efficient kernel cannot group heads
    (torch.float32, 64, 8, 8, 16, 48, "efficient"),
    (torch.bfloat16, 576, 8, 2, 16, 48, "expand-kv"),  # wider than flash takes
])
def test_sdpa_route(dtype, width, hq, hk, lq, lk, want):
    assert kernel.sdpa_route(dtype, width, hq, hk, lq, lk) == want


def _reference(q, k, v, scale):
    """Per head, explicit scores with the bottom-right causal rule (query i sees keys 0..Lk-Lq+i)."""
    hq, lq, _ = q.shape
    hk, lk, _ = k.shape
    out = torch.empty(hq, lq, v.shape[-1], dtype=torch.float64)
    for h in range(hq):
        kh, vh = k[h // (hq // hk)].double(), v[h // (hq // hk)].double()
        for i in range(lq):
            s = (q[h, i].double() @ kh[: lk - lq + i + 1].T) * scale
            out[h, i] = torch.softmax(s, -1) @ vh[: lk - lq + i + 1]
    return out


def test_fp32_grouped_heads_after_a_prefix_reach_sdpa_without_a_mask_tensor(monkeypatch):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(h, n, 16, generator=g) for h, n in ((8, 5), (2, 12), (2, 12)))
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q_, k_, v_, attn_mask=None, **kw):
        seen.append((q_.shape[1], k_.shape[1], type(attn_mask), kw.get("enable_gqa")))
        if isinstance(attn_mask, CausalBias):  # what SDPA does with it (a patched SDPA bypasses that)
            return CausalBias._dispatch(q_, k_, v_, attn_mask, **kw)
        return real(q_, k_, v_, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(kernel.F, "scaled_dot_product_attention", spy)
    out = kernel._sdpa(q, k, v, 1 / math.sqrt(16))
    # equal heads and a lazy bias: the efficient kernel's case on CUDA (on CPU the bias then materialises)
    assert seen[0] == (8, 8, CausalBias, False)
    torch.testing.assert_close(out.double(), _reference(q, k, v, 1 / math.sqrt(16)), atol=1e-5, rtol=1e-5)
