"""vpp's fused CPU kernels besides attention (fp32, AVX-512): the routed experts of a chunk in one pass,
RMSNorm in one pass per row, and the rotary embedding's half rotation; built on first use and called
through ctypes. :mod:`vpp.transformer.fused_ops` (norm, rotation) and
:class:`~vpp.transformer.expert_gemm.GroupedExperts` (experts) choose them.

RMSNorm (:func:`rms_norm`): one pass for each row's mean square, one for ``w * (x * r)``, against the
reference's six (``pow``, ``mean``, ``add``, ``rsqrt``, two ``mul``). The rotation (:func:`rotate_half`):
``x * cos + cat(-x2, x1) * sin`` in one pass with the same roundings (each product rounded before the
sum; bitwise equal to the reference), against five (``mul``, ``neg``, ``cat``, ``mul``, ``add``).

The MoE kernel (:func:`experts`; ``csrc/cpu_ops.cpp`` says how): for this rank's (token, expert) pairs sorted by
local expert, each pair's ``down[e] (silu(gate[e] x_t) * up[e] x_t)`` times its routing weight, added
to its token's output row in pair order: what :class:`~vpp.transformer.moe.MoE`'s reference path
(``index_select``, one ``mm`` per expert and projection, ``silu * up``, ``mul``, ``index_add_``)
computes, in one pass with no gathered copy of the rows, no [pairs, 2I] buffer and no per-expert call.
The expert weights are read as stored ([E, 2I, H] and [E, H, I]): no packed copy of them is kept.

Why: the reference's expert GEMMs ran at about 170 GFLOP/s on one AVX-512 core (MKL re-packs each
expert's weight for every call of ~256 rows), and the gather, activation and scatter around them
cost another pass each over the rows (``benchmarks/moe_kernel.py`` measures both).

Where they are not used (the reference runs): not x86-64, no AVX-512 F/DQ, no compiler, a failed build
(logged once), dtype other than float32, an activation other than SiLU, or ``VPP_CPU_OPS=torch``.
``VPP_CPU_OPS=vpp`` makes an unusable kernel an error instead. The library is built like the
attention kernel's (:mod:`vpp.transformer.native`, same cache directory).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from vpp.transformer import native

SOURCE = Path(__file__).with_name("csrc") / "cpu_ops.cpp"
ENV = "VPP_CPU_OPS"

_lock = threading.Lock()
_state: dict = {}


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(native.build(SOURCE, "libvpp_ops")))
    if lib.vpp_moe_abi() != 1:
        raise RuntimeError(f"{SOURCE.name}: unexpected ABI {lib.vpp_moe_abi()}")
    if not lib.vpp_moe_cpu_ok():
        raise RuntimeError("this CPU has no AVX-512 F/DQ")
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.vpp_moe_f32.argtypes = [ptr, i64, ptr, i64, i64, i64, i64, ptr, ptr, i64, ptr, ptr, i64, ptr, i64, i64,
                                ptr, i64, i64, ptr, ctypes.c_int]
    lib.vpp_moe_f32.restype = ctypes.c_int
    lib.vpp_rms_norm_f32.argtypes = [ptr, i64, i64, i64, ptr, ctypes.c_float, ptr]
    lib.vpp_rms_norm_f32.restype = ctypes.c_int
    lib.vpp_rope_half_f32.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr, ptr]
    lib.vpp_rope_half_f32.restype = ctypes.c_int
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernel, or None where it cannot run here (the reason: :func:`unavailable_reason`)."""
    return native.load_once(_state, _lock, _load, "vpp's CPU MoE kernel", "torch's per-expert GEMMs run instead")


def unavailable_reason() -> str | None:
    library()
    return _state["why"]


def supports(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, activation: str) -> bool:
    """Whether :func:`experts` takes these here (and ``VPP_CPU_OPS`` lets it)."""
    return _usable(x.device.type == gate_up.device.type == down.device.type == "cpu" and activation == "silu"
                   and x.dtype == gate_up.dtype == down.dtype == torch.float32 and x.dim() == 2)


def _usable(fits: bool) -> bool:
    """The kernel for arguments that ``fits`` it, where ``VPP_CPU_OPS`` lets it and it runs here."""
    return native.usable(ENV, fits, library, _state, "vpp's CPU ops (MoE, RMSNorm, RoPE)")


def experts(x: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor, counts: list[int], local: list[int],
            gate_up: torch.Tensor, down: torch.Tensor, out: torch.Tensor | None = None,
            threads: int | None = None) -> torch.Tensor:
    """``out`` (default: zeros like ``x``) plus, for each pair p (sorted by expert: ``counts[i]`` pairs
    of local expert ``local[i]``, in order), ``weights[p] * down[e] (silu(G x) * U x)`` with
    ``x = x[tokens[p]]`` and ``G``, ``U`` the halves of ``gate_up[e]`` [2I, H], added to row
    ``tokens[p]`` in increasing p. ``down`` [E, H, I]. Call :func:`supports` first."""
    lib = library()
    t_n, h = x.shape
    e_n, two_i, h_gu = gate_up.shape
    inter = two_i // 2
    if h_gu != h or two_i % 2 or down.shape != (e_n, h, inter) or len(counts) != len(local):
        raise ValueError(f"experts gate_up {tuple(gate_up.shape)}, down {tuple(down.shape)} do not fit x "
                         f"{tuple(x.shape)} ({len(counts)} counts for {len(local)} experts)")
    pairs = int(sum(counts))
    if tokens.shape != (pairs,) or weights.shape != (pairs,):
        raise ValueError(f"{pairs} pairs but tokens {tuple(tokens.shape)}, weights {tuple(weights.shape)}")
    if local and not 0 <= min(local) <= max(local) < e_n:
        raise ValueError(f"local experts {local} outside [0, {e_n})")
    x = x if x.stride(1) == 1 else x.contiguous()
    gate_up = gate_up if gate_up.stride(2) == 1 else gate_up.contiguous()
    down = down if down.stride(2) == 1 else down.contiguous()
    tokens = tokens.to(torch.int64).contiguous()
    weights = weights.to(torch.float32).contiguous()
    if pairs and not (0 <= int(tokens.min()) and int(tokens.max()) < t_n):
        raise ValueError(f"token ids outside [0, {t_n})")
    if out is None:
        out = torch.zeros(t_n, h, dtype=torch.float32, device=x.device)
    elif out.shape != (t_n, h) or out.dtype != torch.float32 or out.stride(1) != 1:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} is not a [{t_n}, {h}] float32 row-major tensor")
    threads = int(threads or torch.get_num_threads())
    starts = [0]
    for n in counts:
        starts.append(starts[-1] + int(n))
    # every tensor on x's device (the CPU): under `with torch.device(...)` a bare tensor() would land elsewhere
    seg_expert = torch.tensor(local, dtype=torch.int64, device=x.device)
    seg_start = torch.tensor(starts, dtype=torch.int64, device=x.device)
    ybuf = torch.empty(pairs, h, dtype=torch.float32, device=x.device) if threads > 1 and pairs else None
    rc = lib.vpp_moe_f32(x.data_ptr(), x.stride(0), out.data_ptr(), out.stride(0), t_n, h, inter,
                         tokens.data_ptr(), weights.data_ptr(), pairs, seg_expert.data_ptr(), seg_start.data_ptr(),
                         len(local), gate_up.data_ptr(), gate_up.stride(0), gate_up.stride(1), down.data_ptr(),
                         down.stride(0), down.stride(1), None if ybuf is None else ybuf.data_ptr(), threads)
    if rc:
        raise (MemoryError if rc == -2 else ValueError)(
            f"vpp_moe_f32 refused x {tuple(x.shape)}, {pairs} pairs, experts {tuple(gate_up.shape)} ({rc})")
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """``weight * (x * rsqrt(mean(x^2) + eps))`` over the last dim (fp32), or None where the kernel does
    not take it (the caller runs the reference)."""
    n = x.shape[-1] if x.dim() else 0
    fits = (x.device.type == weight.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
            and x.dim() >= 1 and n > 0 and weight.shape == (n,) and weight.is_contiguous() and x.is_contiguous())
    if not _usable(fits):
        return None
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    rc = library().vpp_rms_norm_f32(x.data_ptr(), x.numel() // n, n, n, weight.data_ptr(), float(eps), out.data_ptr())
    if rc:
        raise ValueError(f"vpp_rms_norm_f32 refused x {tuple(x.shape)} ({rc})")
    return out


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """x [c, heads, d], cos / sin [c, d]: ``x * cos + cat(-x2, x1) * sin`` (fp32, bitwise the reference's),
    or None where the kernel does not take it."""
    fits = (x.dim() == 3 and x.device.type == cos.device.type == sin.device.type == "cpu"
            and x.dtype == cos.dtype == sin.dtype == torch.float32 and x.shape[-1] % 2 == 0 and x.stride(-1) == 1
            and cos.shape == sin.shape == (x.shape[0], x.shape[2]) and cos.is_contiguous() and sin.is_contiguous())
    if not _usable(fits):
        return None
    c, heads, d = x.shape
    out = torch.empty(c, heads, d, dtype=torch.float32, device=x.device)
    rc = library().vpp_rope_half_f32(x.data_ptr(), c, heads, d, x.stride(0), x.stride(1), cos.data_ptr(),
                                     sin.data_ptr(), out.data_ptr())
    if rc:
        raise ValueError(f"vpp_rope_half_f32 refused x {tuple(x.shape)} ({rc})")
    return out


__all__ = ["ENV", "SOURCE", "experts", "library", "rms_norm", "rotate_half", "supports", "unavailable_reason"]
