"""``math_lse`` (explicit scores, the kernel for devices without a fused one and the NPU's fallback)
against closed-form softmax attention, and without a chunk x chunk causal mask: it works in blocks of
``MATH_BLOCK`` query rows and masks only the diagonal tile of each."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vpp.transformer.attention.kernel import MATH_BLOCK, math_lse


def closed_form(q, k, v, scale, causal):
    s = (q.double() @ k.double().transpose(1, 2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.double(), torch.logsumexp(s, -1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 7, MATH_BLOCK, MATH_BLOCK + 1, 2 * MATH_BLOCK + 45])
def test_math_lse_matches_closed_form(causal, n):
    g = torch.Generator().manual_seed(n)
    lk = n if causal else n + 19
    q, k = torch.randn(3, n, 24, generator=g), torch.randn(3, lk, 24, generator=g)
    v = torch.randn(3, lk, 16, generator=g)
    out, lse = math_lse(q, k, v, 0.2, causal)
    ref, ref_lse = closed_form(q, k, v, 0.2, causal)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_math_lse_keeps_bf16_output():
    q = torch.randn(2, 40, 16).bfloat16()
    out, lse = math_lse(q, q, q, 0.25, True)
    ref, ref_lse = closed_form(q, q, q, 0.25, True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-4)


class Shapes(TorchDispatchMode):
    """Records the shape of every tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.seen.append((str(func), tuple(t.shape)))
        return out


def test_causal_math_lse_builds_no_chunk_sized_mask_or_scores():
    n = 3 * MATH_BLOCK + 5
    q = torch.randn(2, n, 8)
    with Shapes() as shapes:
        math_lse(q, q, q, 0.3, True)
    # no [n, n] (or [H, n, n]) tensor at all: neither a mask nor the full scores
    square = [(f, s) for f, s in shapes.seen if len(s) >= 2 and s[-2:] == (n, n)]
    assert not square, square[:3]
    # the largest score block is [H, MATH_BLOCK, n]
    biggest = max(torch.Size(s).numel() for _, s in shapes.seen)
    assert biggest <= 2 * MATH_BLOCK * n, biggest
