"""The attention kernels, chosen in one place.

:func:`causal_attention` computes softmax(q k^T * scale) v for a chunk whose ``Lq`` queries are the
*last* ``Lq`` of the ``Lk`` key positions (a chunk after a cached prefix). The causal diagonal is
therefore aligned bottom-right: query i sees keys 0 .. Lk - Lq + i. (``F.scaled_dot_product_attention
(is_causal=True)`` aligns it top-left when Lq != Lk, which is wrong after a prefix.)

:func:`attention_lse` is the building block for attention computed in pieces: it returns the output
*and* the log-sum-exp of each query's scores over the keys it was given, and :func:`merge_partials`
combines two pieces exactly (the "online softmax" merge of FlashAttention / ring attention)::

    lse = logaddexp(lse_a, lse_b);  out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b

It takes two kinds of pieces only, so every kernel agrees on the mask: ``causal=False`` (every query
sees every key given) and ``causal=True`` with as many queries as keys (query i sees keys 0..i).

Kernels, per device kind:

* CPU, fp32 on a core with AVX-512: vpp's own kernel (:mod:`.cpu_kernel`), one pass over the keys
  for the whole bottom-right causal chunk and for every piece, grouped-query heads in the kernel.
* CPU otherwise (and with ``VPP_CPU_ATTENTION=torch``, the reference it is tested against):
  ``causal_attention`` with Lq < Lk is the prefix (no mask) merged with the square diagonal
  (``is_causal``): no [Lq, Lk] mask is built, so its memory does not grow with the prefix; pieces come
  from ``aten._scaled_dot_product_flash_attention_for_cpu`` (it returns the log-sum-exp). One query
  (a decode step) sees every key: one piece, no merge.
* CUDA: PyTorch SDPA with the lazy bottom-right causal bias (no mask materialised); pieces from
  ``aten._scaled_dot_product_flash_attention`` (fp16/bf16) or ``_efficient_attention`` (fp32). The
  bias reaches a fused kernel only where one takes it: flash (16 bits, head width <= 256, grouped
  heads included) or memory-efficient (any width, fp32, but no grouped heads); anything else would
  materialise the [Lq, Lk] mask and run the math path, so :func:`sdpa_route` repeats the key/value
  heads for the efficient kernel instead (memory grows with Lk, not Lq x Lk).
* NPU: ``torch_npu.npu_fusion_attention`` (sparse_mode 3 = bottom-right causal, grouped-query heads
  natively); pieces from the same op's softmax max/sum. The op takes float16/bfloat16 only and a head
  width of at most 512 (older CANN: a multiple of 16): :func:`npu_attention_route` zero-pads the
  width up to a multiple of 16 (zero columns change neither q.k nor the kept output columns) and sends
  float32 or wider heads to the blocked explicit-score path below, so the op is never called with
  arguments it refuses. Import-guarded; tested on CPU against a fake that enforces that contract
  (``benchmarks/device_check.py`` exercises the real op on a machine that has one).
* anywhere else, and the NPU's fallback: explicit scores (:func:`math_lse`, the reference the others
  are tested against) in blocks of ``MATH_BLOCK`` query rows: a causal piece masks only the
  ``MATH_BLOCK`` x ``MATH_BLOCK`` tile on the diagonal of each block, so no chunk x chunk mask exists
  and the scores held at once are ``H x MATH_BLOCK x Lk``.

Grouped-query heads (Hk dividing Hq): a piece without a mask stacks the query heads that share a key
head along the query axis (no copy of K/V); a causal piece repeats the K/V heads of its (chunk-sized)
keys.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Callable

import torch
import torch.nn.functional as F
from einops import rearrange

from vpp.transformer.attention import cpu_kernel

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
Partial = tuple[torch.Tensor, torch.Tensor]  # (output [H, Lq, Dv], log-sum-exp [H, Lq] fp32)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Hq, Lq, D], k [Hk, Lk, D], v [Hk, Lk, Dv] with Hk dividing Hq (grouped-query heads) and
    Lq <= Lk; returns [Hq, Lq, Dv]."""
    _check_heads(q, k)
    if q.shape[1] > k.shape[1]:
        raise ValueError(f"{q.shape[1]} queries but only {k.shape[1]} keys: the chunk must be in the keys")
    return kernel_for(q.device.type)(q, k, v, scale)


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, *,
                  causal: bool = False) -> Partial:
    """One piece of an attention: q [Hq, Lq, D] over k [Hk, Lk, D], v [Hk, Lk, Dv] (Hk dividing Hq).
    ``causal=False``: every query sees every key; ``causal=True`` needs Lq == Lk and lets query i see
    keys 0..i. Returns (output [Hq, Lq, Dv] in q's dtype, log-sum-exp [Hq, Lq] in fp32)."""
    _check_heads(q, k)
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(f"a causal piece needs as many queries as keys, got {q.shape[1]} and {k.shape[1]}")
    if k.shape[1] == 0:
        raise ValueError("an attention piece needs at least one key")
    if cpu_kernel.supports(q, k, v):  # CPU fp32 on AVX-512: grouped heads in the kernel itself
        return cpu_kernel.attention(q, k, v, scale, 0 if causal else k.shape[1])
    hq, hk = q.shape[0], k.shape[0]
    if hq == hk:
        return lse_kernel_for(q.device.type)(q, k, v, scale, causal)
    group = hq // hk
    if causal:  # chunk-sized keys: repeat them per query head
        return lse_kernel_for(q.device.type)(q, k.repeat_interleave(group, 0), v.repeat_interleave(group, 0),
                                             scale, True)
    stacked = rearrange(q, "(hk g) l d -> hk (g l) d", g=group)  # the query heads sharing key head hk, in a row
    out, lse = lse_kernel_for(q.device.type)(stacked, k, v, scale, False)
    return rearrange(out, "hk (g l) d -> (hk g) l d", g=group), rearrange(lse, "hk (g l) -> (hk g) l", g=group)


def merge_partials(a: Partial, b: Partial) -> Partial:
    """Attention over the union of two disjoint key sets from the two pieces (fp32 log-sum-exp weights;
    the output keeps ``a``'s dtype)."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    lse = torch.logaddexp(lse_a, lse_b)
    wa, wb = (lse_a - lse).exp_().unsqueeze(-1), (lse_b - lse).exp_().unsqueeze(-1)
    out = out_a.float().mul_(wa).add_(out_b.float().mul_(wb))
    return out.to(out_a.dtype), lse


def _check_heads(q: torch.Tensor, k: torch.Tensor) -> None:
    if q.shape[0] % k.shape[0]:
        raise ValueError(f"{k.shape[0]} key heads do not divide {q.shape[0]} query heads")


@lru_cache(maxsize=None)
def kernel_for(device_type: str) -> Kernel:
    """The causal kernel for a device kind: the one place where it is chosen."""
    if device_type == "npu" and _torch_npu() is not None:
        return _npu_causal
    if device_type == "cpu":
        return _cpu_split
    return _sdpa


@lru_cache(maxsize=None)
def lse_kernel_for(device_type: str):
    """The piece kernel (output and log-sum-exp, equal head counts) for a device kind."""
    if device_type == "cpu":
        return _cpu_lse
    if device_type == "cuda":
        return _cuda_lse
    if device_type == "npu" and _torch_npu() is not None:
        return _npu_lse
    return math_lse


def _same_width(q, k, v):
    """Zero-pad q/k or v to one head width (MLA's value width differs from its query/key width):
    fused kernels want one width, and zero columns change neither q.k nor the kept output columns."""
    width = max(q.shape[-1], v.shape[-1])
    return tuple(F.pad(t, (0, width - t.shape[-1])) if t.shape[-1] < width else t for t in (q, k, v))


FLASH_MAX_WIDTH = 256


def sdpa_route(dtype: torch.dtype, width: int, q_heads: int, kv_heads: int, lq: int, lk: int) -> str:
    """How :func:`_sdpa` calls SDPA on CUDA so that no causal mask is materialised: ``"causal"`` (a
    square block: ``is_causal``), ``"flash"`` (the lower-right bias with grouped heads, 16 bits and
    width <= 256), ``"efficient"`` (the bias, equal head counts), ``"expand-kv"`` (the bias on the
    efficient kernel after repeating the key/value heads, which it cannot group)."""
    if lq == lk:
        return "causal"
    if dtype in (torch.float16, torch.bfloat16) and width <= FLASH_MAX_WIDTH:
        return "flash"
    return "efficient" if q_heads == kv_heads else "expand-kv"


@lru_cache(maxsize=None)
def _causal_lower_right():
    """``torch.nn.attention.bias.causal_lower_right``, imported on first use: that module imports
    torch._dynamo (about a second), which a process that never runs SDPA with a bias does not need."""
    from torch.nn.attention.bias import causal_lower_right
    return causal_lower_right


def _sdpa(q, k, v, scale):
    lq, lk, dv = q.shape[1], k.shape[1], v.shape[-1]
    q, k, v = _same_width(q, k, v)  # different widths send SDPA to its slow math path
    route = sdpa_route(q.dtype, q.shape[-1], q.shape[0], k.shape[0], lq, lk)
    if route == "expand-kv":
        group = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    mask = None if route == "causal" else _causal_lower_right()(lq, lk)  # lazy: a fused kernel takes it as is
    out = F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=mask, is_causal=route == "causal", scale=scale,
        enable_gqa=q.shape[0] != k.shape[0],
    )
    return out[0, ..., :dv]


def _cpu_split(q, k, v, scale):
    """CPU: vpp's kernel in one pass where it runs (it packs K^T once per call, at most 64 MB); else the
    square diagonal with ``is_causal``, and after a prefix the prefix piece (no mask) merged with the
    diagonal piece, neither of which holds more than K/V themselves that grows with the prefix."""
    lq, lk = q.shape[1], k.shape[1]
    if cpu_kernel.supports(q, k, v):  # written positions-major: the layers go on with out.transpose(0, 1)
        return cpu_kernel.attention(q, k, v, scale, lk - lq, position_major=True)[0]
    if lq == lk:
        return _sdpa(q, k, v, scale)
    if lq == 1:  # a decode step: the last position sees every key, one piece without a mask
        return attention_lse(q, k, v, scale)[0]
    prefix = lk - lq
    whole = attention_lse(q, k[:, :prefix], v[:, :prefix], scale)
    diag = attention_lse(q, k[:, prefix:], v[:, prefix:], scale, causal=True)
    return merge_partials(whole, diag)[0]


def _cpu_lse(q, k, v, scale, causal):
    dv = v.shape[-1]
    q, k, v = _same_width(q, k, v)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q[None], k[None], v[None], 0.0, causal, scale=scale)
    return out[0, ..., :dv], lse[0]


def _cuda_lse(q, k, v, scale, causal):
    dv = v.shape[-1]
    q, k, v = _same_width(q, k, v)
    if q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
            q[None], k[None], v[None], 0.0, causal, False, scale=scale)[:2]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q[None], k[None], v[None], None, True, 0.0, causal, scale=scale)[:2]
    return out[0, ..., :dv], lse[0, :, : q.shape[1]]  # the efficient kernel pads lse to 32 queries


MATH_BLOCK = 128


def math_lse(q, k, v, scale, causal):
    """Explicit scores in fp32: the reference piece (and the kernel for devices without another), in
    blocks of ``MATH_BLOCK`` query rows. Causal (square): the rows r0..r1 of a block see keys 0..r1-1,
    and of those only the diagonal tile [r0, r1) x [r0, r1) needs a mask (its strict upper triangle),
    a fixed ``MATH_BLOCK`` x ``MATH_BLOCK`` tile whatever the chunk."""
    heads, n, lk = q.shape[0], q.shape[1], k.shape[1]
    kf, vf = k.float(), v.float()
    out = torch.empty(heads, n, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(heads, n, dtype=torch.float32, device=q.device)
    for r0 in range(0, n, MATH_BLOCK):
        r1 = min(n, r0 + MATH_BLOCK)
        keys = r1 if causal else lk
        scores = (q[:, r0:r1].float() @ kf[:, :keys].transpose(1, 2)).mul_(scale)
        if causal:
            scores[:, :, r0:r1].masked_fill_(_upper_tile(q.device)[: r1 - r0, : r1 - r0], float("-inf"))
        block_lse = torch.logsumexp(scores, dim=-1)
        out[:, r0:r1] = ((scores - block_lse.unsqueeze(-1)).exp_() @ vf[:, :keys]).to(q.dtype)
        lse[:, r0:r1] = block_lse
    return out, lse


@lru_cache(maxsize=None)
def _upper_tile(device: torch.device) -> torch.Tensor:
    """True above the diagonal of a MATH_BLOCK x MATH_BLOCK tile: key j hidden from query i when j > i."""
    return torch.ones(MATH_BLOCK, MATH_BLOCK, dtype=torch.bool, device=device).triu_(1)


def _pieces_split(q, k, v, scale):
    """Causal attention from :func:`attention_lse` pieces: the square diagonal alone, or after a prefix
    the prefix piece (no mask) merged with the diagonal piece."""
    lq, lk = q.shape[1], k.shape[1]
    diag = attention_lse(q, k[:, lk - lq:], v[:, lk - lq:], scale, causal=True)
    if lq == lk:
        return diag[0]
    return merge_partials(attention_lse(q, k[:, :lk - lq], v[:, :lk - lq], scale), diag)[0]


def _torch_npu():
    try:
        return importlib.import_module("torch_npu")
    except Exception:  # missing or broken CANN install
        return None


NPU_FA_DTYPES = (torch.float16, torch.bfloat16)
NPU_FA_WIDTH_ALIGN = 16
NPU_FA_MAX_WIDTH = 512


def npu_attention_route(dtype: torch.dtype, width: int) -> tuple[str, int]:
    """How an NPU attention of head width ``width`` (the larger of the query/key and value widths)
    runs (pure, tested on CPU): ``("fused", padded)``, ``npu_fusion_attention`` on inputs zero-padded to
    ``padded`` columns (the next multiple of 16), or ``("math", width)``, the blocked explicit scores,
    for what the op refuses in older CANN (float32, or a width that pads past 512)."""
    padded = -(-width // NPU_FA_WIDTH_ALIGN) * NPU_FA_WIDTH_ALIGN
    if dtype in NPU_FA_DTYPES and padded <= NPU_FA_MAX_WIDTH:
        return "fused", padded
    return "math", width


def _pad_width(q, k, v, width):
    """Zero-pad q, k and v to ``width`` columns (see :func:`_same_width`)."""
    return tuple(F.pad(t, (0, width - t.shape[-1])) if t.shape[-1] < width else t for t in (q, k, v))


def _npu_causal(q, k, v, scale):
    route, width = npu_attention_route(q.dtype, max(q.shape[-1], v.shape[-1]))
    if route == "math":
        return _pieces_split(q, k, v, scale)  # pieces: _npu_lse, which routes them to math_lse
    return _npu_fused(q, k, v, scale, width)


def _npu_fused(q, k, v, scale, width):
    """npu_fusion_attention, BNSD layout, bottom-right causal (sparse_mode 3); key heads dividing the
    query heads are handled by the op itself (no repeated K/V)."""
    npu = _torch_npu()
    heads, dv = q.shape[0], v.shape[-1]
    q, k, v = _pad_width(q, k, v, width)
    out = npu.npu_fusion_attention(
        q[None], k[None], v[None], heads, "BNSD", atten_mask=_npu_causal_mask(q.device),
        scale=scale, sparse_mode=3,
    )[0]
    return out[0, ..., :dv]


def _npu_lse(q, k, v, scale, causal):
    """npu_fusion_attention's softmax statistics give the log-sum-exp: max + log(sum) (both
    [B, N, S, 8] fp32, the 8 copies equal). What the op refuses goes to :func:`math_lse`."""
    route, width = npu_attention_route(q.dtype, max(q.shape[-1], v.shape[-1]))
    if route == "math":
        return math_lse(q, k, v, scale, causal)
    npu = _torch_npu()
    heads, dv = q.shape[0], v.shape[-1]
    q, k, v = _pad_width(q, k, v, width)
    # a causal piece is square, where the bottom-right diagonal (sparse_mode 3, as above) is the top-left one
    kw = dict(atten_mask=_npu_causal_mask(q.device), sparse_mode=3) if causal else {}
    out, smax, ssum = npu.npu_fusion_attention(q[None], k[None], v[None], heads, "BNSD", scale=scale, **kw)[:3]
    return out[0, ..., :dv], smax[0, ..., 0] + ssum[0, ..., 0].log()


@lru_cache(maxsize=None)
def _npu_causal_mask(device: torch.device) -> torch.Tensor:
    # sparse_mode 3 takes the compressed 2048 x 2048 upper-triangular mask (True = masked)
    return torch.ones(2048, 2048, dtype=torch.bool, device=device).triu(1)


__all__ = [
    "FLASH_MAX_WIDTH", "Kernel", "MATH_BLOCK", "NPU_FA_DTYPES", "NPU_FA_MAX_WIDTH", "NPU_FA_WIDTH_ALIGN",
    "Partial", "attention_lse", "causal_attention", "kernel_for", "lse_kernel_for", "math_lse",
    "merge_partials", "npu_attention_route", "sdpa_route",
]
