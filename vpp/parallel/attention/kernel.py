"""The attention kernel, chosen in one place.

:func:`causal_attention` computes softmax(q k^T * scale) v for a chunk whose ``Lq`` queries are the
*last* ``Lq`` of the ``Lk`` key positions (a chunk after a cached prefix). The causal diagonal is
therefore aligned bottom-right: query i sees keys 0 .. Lk - Lq + i. (``F.scaled_dot_product_attention
(is_causal=True)`` aligns it top-left when Lq != Lk, which is wrong after a prefix.)

Kernels: ``torch_npu.npu_fusion_attention`` (sparse_mode 3 = bottom-right causal) on an NPU when
torch_npu imports; PyTorch SDPA everywhere else (CPU, CUDA). The NPU path is import-guarded and
untested without the hardware.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Hq, Lq, D], k [Hk, Lk, D], v [Hk, Lk, Dv] with Hk dividing Hq (grouped-query heads) and
    Lq <= Lk; returns [Hq, Lq, Dv]."""
    if q.shape[1] > k.shape[1]:
        raise ValueError(f"{q.shape[1]} queries but only {k.shape[1]} keys: the chunk must be in the keys")
    if q.shape[0] % k.shape[0]:
        raise ValueError(f"{k.shape[0]} key heads do not divide {q.shape[0]} query heads")
    return kernel_for(q.device.type)(q, k, v, scale)


@lru_cache(maxsize=None)
def kernel_for(device_type: str) -> Kernel:
    """The kernel for a device kind: the one place where it is chosen."""
    if device_type == "npu" and _torch_npu() is not None:
        return _npu_fused
    return _sdpa


def _same_width(q, k, v):
    """Zero-pad q/k or v to one head width (MLA's value width differs from its query/key width):
    fused kernels want one width, and zero columns change neither q.k nor the kept output columns."""
    width = max(q.shape[-1], v.shape[-1])
    return tuple(F.pad(t, (0, width - t.shape[-1])) if t.shape[-1] < width else t for t in (q, k, v))


def _sdpa(q, k, v, scale):
    lq, lk, dv = q.shape[1], k.shape[1], v.shape[-1]
    q, k, v = _same_width(q, k, v)  # different widths send SDPA to its slow math path on CPU
    mask = None if lq == lk else _bottom_right_mask(lq, lk, q.dtype, q.device)
    out = F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=mask, is_causal=lq == lk, scale=scale,
        enable_gqa=q.shape[0] != k.shape[0],
    )
    return out[0, ..., :dv]


def _bottom_right_mask(lq: int, lk: int, dtype: torch.dtype, device: torch.device):
    if device.type != "cpu":  # CUDA kernels take the lazy bias without materialising it
        return causal_lower_right(lq, lk)
    return _additive_mask(lq, lk, dtype)


@lru_cache(maxsize=2)  # lq x lk floats each (64 MiB at 1K x 16K): the current chunk shape, and one more
def _additive_mask(lq: int, lk: int, dtype: torch.dtype) -> torch.Tensor:
    """0 where query i may see key j (j <= lk - lq + i), -inf elsewhere; built once per chunk shape
    and shared by every layer (SDPA would otherwise convert a boolean mask on every call)."""
    allowed = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
    return torch.zeros(lq, lk, dtype=dtype).masked_fill_(~allowed, float("-inf"))


def _torch_npu():
    try:
        return importlib.import_module("torch_npu")
    except Exception:  # missing or broken CANN install
        return None


def _npu_fused(q, k, v, scale):
    npu = _torch_npu()
    heads, dv = q.shape[0], v.shape[-1]
    if k.shape[0] != heads:  # repeat KV heads rather than rely on the op's GQA support
        k = k.repeat_interleave(heads // k.shape[0], dim=0)
        v = v.repeat_interleave(heads // v.shape[0], dim=0)
    q, k, v = _same_width(q, k, v)
    out = npu.npu_fusion_attention(
        q[None], k[None], v[None], heads, "BNSD", atten_mask=_npu_causal_mask(q.device),
        scale=scale, sparse_mode=3,
    )[0]
    return out[0, ..., :dv]


@lru_cache(maxsize=None)
def _npu_causal_mask(device: torch.device) -> torch.Tensor:
    # sparse_mode 3 takes the compressed 2048 x 2048 upper-triangular mask (True = masked)
    return torch.ones(2048, 2048, dtype=torch.bool, device=device).triu(1)
