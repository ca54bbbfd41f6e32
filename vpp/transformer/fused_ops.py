"""The fused element-wise kernels of a layer, chosen in one place: RMSNorm, the SwiGLU activation,
rotary embeddings and MoE gating (top-k). Attention's kernels are chosen in
:mod:`vpp.transformer.attention.kernel`, the expert GEMMs' in :mod:`vpp.transformer.expert_gemm`.

On an Ascend NPU (a tensor on ``npu`` and ``torch_npu`` importable) each op goes to torch_npu's fused
operator, as vLLM-Ascend uses them; everywhere else, and for any argument the operator's documented
contract refuses, the reference below runs (plain torch, what the CPU tests check against
transformers). The contracts, from torch_npu 2.13.0's documentation:

* ``npu_rms_norm(x, gamma, epsilon) -> (y, rstd)``: float16 / bfloat16 / float32, ``gamma`` of x's
  dtype, 2-8 dims; y = x * rsqrt(mean(x^2) + eps) * gamma. The reference computes in fp32 and casts
  before the weight (as Hugging Face does): in 16 bits the two differ by rounding (a few ulps).
* ``npu_swiglu(x, dim=-1)``: x split in halves A, B along ``dim``; silu(A) * B. The reference takes
  the gate and up halves the same way (``gate_up`` = [G | U]).
* ``npu_rotary_mul(x, r1, r2, rotary_mode='half')``: 4-dim x (BSND here), r1/r2 shaped 1S1D, head
  width even and < 896; out = r1 * x + r2 * cat(-x2, x1). Interleaved rotations (DeepSeek) run the
  same op on the de-interleaved input, which is exactly what :func:`vpp.transformer.attention.rope.apply_rope_interleaved` returns.
* ``npu_moe_gating_top_k_softmax(x, finished=None, k)``: softmax then top-k, values in x's dtype,
  int32 ids (2-3 dims, k <= 1024). Softmax routing only.
* ``npu_moe_gating_top_k(x, k, bias=, k_group=, group_count=, group_select_mode=1, renorm=0,
  norm_type=1, routed_scaling_factor=, eps=)``: DeepSeek's sigmoid + bias + group-limited selection
  (groups scored by their top-2 sum), weights = chosen sigmoids / (sum + eps) * factor. It always
  renormalises, so it serves ``norm_topk_prob=True`` only, and its limits (2-dim x, <= 2048 experts,
  more than 2 experts per group, the groups 32-aligned within 2048, bias in x's dtype) are checked
  by :func:`npu_gating_ok`.

Each choice is a pure function of the op's arguments, tested on CPU against fakes that enforce these
contracts (``tests/transformer/test_fused_ops.py``). Nothing here was run on an NPU in this
repository's CI: ``benchmarks/device_check.py`` is where a machine that has one checks them.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from vpp.transformer import cpu_ops

NPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
NPU_ROPE_MAX_WIDTH = 896
NPU_GATING_MAX_EXPERTS = 2048


def _torch_npu():
    try:
        return importlib.import_module("torch_npu")
    except Exception:  # missing or broken CANN install
        return None


def npu_for(x: torch.Tensor):
    """torch_npu when ``x`` lives on an NPU and the module imports, else None (the reference runs)."""
    return _torch_npu() if x.device.type == "npu" else None


# -- RMSNorm ----------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * w over the last dim."""
    npu = npu_for(x)
    if npu is not None and x.dtype in NPU_DTYPES and weight.dtype == x.dtype and 2 <= x.dim() <= 8:
        return npu.npu_rms_norm(x, weight, epsilon=eps)[0]
    if x.device.type == "cpu" and x.dtype == torch.float32:
        out = cpu_ops.rms_norm(x, weight, eps)  # vpp's one-pass CPU kernel, where it runs
        if out is not None:
            return out
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


# -- SwiGLU -----------------------------------------------------------------------------------------
def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(G) * U for ``gate_up`` = [G | U] along the last dim."""
    npu = npu_for(gate_up)
    if npu is not None and gate_up.dtype in NPU_DTYPES and 1 <= gate_up.dim() <= 8:
        return npu.npu_swiglu(gate_up, dim=-1)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gated(act, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act(G) * U for separate halves: the fused op where ``act`` is SiLU and a fused op exists."""
    if act is F.silu and npu_for(gate) is not None:
        return swiglu(torch.cat((gate, up), dim=-1))
    return act(gate).mul_(up)


def gated_halves(act, gate_up: torch.Tensor) -> torch.Tensor:
    """act(G) * U for ``gate_up`` = [G | U] (one GEMM's output, as the experts compute it)."""
    if act is F.silu and npu_for(gate_up) is not None:
        return swiglu(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return act(gate).mul_(up)


# -- rotary embeddings ------------------------------------------------------------------------------
def npu_rope_ok(x: torch.Tensor) -> bool:
    """x [c, heads, dim]: what npu_rotary_mul's half mode takes (as BSND with B = 1)."""
    width = x.shape[-1]
    return x.dim() == 3 and x.dtype in NPU_DTYPES and width % 2 == 0 and width < NPU_ROPE_MAX_WIDTH \
        and x.shape[1] < 1000


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [c, heads, dim], cos/sin [c, dim]: x * cos + cat(-x2, x1) * sin."""
    npu = npu_for(x)
    if npu is not None and npu_rope_ok(x) and cos.dtype == x.dtype:
        r1, r2 = cos[None, :, None, :], sin[None, :, None, :]  # 1S1D for BSND
        return npu.npu_rotary_mul(x[None], r1, r2, rotary_mode="half")[0]
    if x.device.type == "cpu" and x.dtype == torch.float32:
        out = cpu_ops.rotate_half(x, cos, sin)  # vpp's one-pass CPU kernel, where it runs
        if out is not None:
            return out
    cos, sin = cos[:, None, :], sin[:, None, :]
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pairwise rotation of (x0, x1), (x2, x3), ... written de-interleaved (first members, then second
    members): the half rotation of the de-interleaved input."""
    if npu_for(x) is not None:
        return rotate_half(torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1), cos, sin)
    half = cos.shape[-1] // 2
    c, s = cos[:, None, :half], sin[:, None, :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


# -- MoE gating -------------------------------------------------------------------------------------
def npu_gating_ok(experts: int, top_k: int, n_group: int, topk_group: int) -> bool:
    """Whether npu_moe_gating_top_k takes this selection (its documented limits)."""
    if experts > NPU_GATING_MAX_EXPERTS or n_group < 1 or experts % n_group:
        return False
    per_group = experts // n_group
    aligned = -(-per_group // 32) * 32
    return per_group > 2 and aligned * n_group <= NPU_GATING_MAX_EXPERTS and 1 <= topk_group <= n_group \
        and 1 <= top_k <= per_group * topk_group


def softmax_gating(logits: torch.Tensor, top_k: int):
    """softmax over the experts, then the ``top_k`` largest: (values, ids int64), or None where no
    fused op applies (the caller runs its reference)."""
    npu = npu_for(logits)
    if npu is None or logits.dim() not in (2, 3) or logits.dtype not in NPU_DTYPES or top_k > 1024:
        return None
    values, ids, _ = npu.npu_moe_gating_top_k_softmax(logits, None, k=top_k)
    return values.float(), ids.long()


def sigmoid_gating(logits: torch.Tensor, top_k: int, *, bias: torch.Tensor | None, n_group: int, topk_group: int,
                   scaling: float):
    """DeepSeek's selection with renormalised weights (times ``scaling``): (weights fp32, ids int64),
    or None where no fused op applies."""
    npu = npu_for(logits)
    experts = logits.shape[-1]
    if npu is None or logits.dim() != 2 or not npu_gating_ok(experts, top_k, n_group, topk_group):
        return None
    kw = {} if bias is None else {"bias": bias.to(logits.dtype)}
    weights, ids, _ = npu.npu_moe_gating_top_k(
        logits, top_k, k_group=topk_group, group_count=n_group, group_select_mode=1, renorm=0, norm_type=1,
        out_flag=False, routed_scaling_factor=scaling, eps=1e-20, **kw)
    return weights.float(), ids.long()


__all__ = ["NPU_DTYPES", "NPU_GATING_MAX_EXPERTS", "NPU_ROPE_MAX_WIDTH", "gated", "gated_halves", "npu_for", "npu_gating_ok",
           "npu_rope_ok", "rms_norm", "rotate_half", "rotate_pairs", "sigmoid_gating", "softmax_gating", "swiglu"]
