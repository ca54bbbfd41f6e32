"""vpp's own CPU attention kernel (fp32, AVX-512): built on first use, called through ctypes.

What it computes (``csrc/attn_avx512.cpp`` says how): for q [Hq, Lq, D], k [Hk, Lk, D], v [Hk, Lk, Dv]
(Hk dividing Hq, grouped-query heads handled in the kernel, no repeated K/V) and an ``offset``, query
i sees keys j <= i + offset; it returns the output [Hq, Lq, Dv] (fp32) and the log-sum-exp [Hq, Lq].
``offset = Lk - Lq`` is a chunk after a cached prefix (bottom-right causal) in one pass, with no
prefix/diagonal merge and no masked key block touched; ``offset = Lk`` every key; ``offset = 0`` with
Lq == Lk a square causal piece.

Why: on one AVX-512 core (a 2-core Xeon with AMX, fp32) it ran a 1024-token chunk of 8 query heads
after 3K-15K cached keys (2 key heads, width 64) at 183-188 GFLOP/s, against 146-158 for torch's CPU
flash kernel called as prefix + diagonal pieces (``benchmarks/attention_kernel.py`` measures both).

Memory: each key head's K^T is packed once per call (keys x width floats, at most 64 MB for the call;
past that each block of queries packs 512 keys at a time), and a value tensor whose rows are not
adjacent (MLA's expanded values) is copied contiguous first.

How it is built: the C++ source ships in the package; the first call compiles it with the C++
compiler (``$CXX``, else ``g++``/``c++``; about a second) into ``$VPP_CACHE_DIR`` (default
``$XDG_CACHE_HOME/vpp`` or ``~/.cache/vpp``), named by a hash of the source and the flags, so later
processes load it. Nothing is compiled at install time and the AVX-512 code is selected per
function, so the library builds on any x86-64; the library says itself whether this CPU runs it.

Where it is not used (the caller falls back to torch's kernel, the reference path): not x86-64, no
AVX-512 F/DQ, no compiler, a failed build (logged once, with the compiler's message), dtype other
than float32, a value width not a multiple of 16, fewer than ``MIN_ROWS`` query rows per key head
(a decode step), or ``VPP_CPU_ATTENTION=torch``.
``VPP_CPU_ATTENTION=vpp`` makes an unusable kernel an error instead of a fallback.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path

import torch

from vpp.transformer import native

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "attn_avx512.cpp"
cache_dir, _compiler, FLAGS, MODES = native.cache_dir, native._compiler, native.FLAGS, native.MODES
# Query rows per key head (grouped heads x queries) below which torch's kernel runs: the kernel packs
# each key head's K^T (keys x width) per call, which a decode step's few rows do not repay (measured:
# one query of 8 heads over 16K keys of 2 heads, width 64: 8.3 ms against torch's 6.0).
MIN_ROWS = 64
ENV = "VPP_CPU_ATTENTION"

_lock = threading.Lock()
_state: dict = {}  # "lib": the loaded library or None, "why": the reason it is None


def mode(env: str = ENV) -> str:
    """``VPP_CPU_ATTENTION``: ``auto`` (default: the kernel where it runs, else torch's), ``vpp`` (the
    kernel or an error) or ``torch`` (always torch's kernel)."""
    return native.mode(env)


def build(directory: Path | None = None, compiler: str | None = None) -> Path:
    """Compile the kernel (or find it already compiled) and return the shared library's path; raises
    RuntimeError (one line, the compiler's last message) where it cannot (:func:`vpp.transformer.native.build`)."""
    return native.build(SOURCE, "libvpp_attn", directory, compiler)


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build()))
    if lib.vpp_attn_abi() != 2:
        raise RuntimeError(f"{SOURCE.name}: unexpected ABI {lib.vpp_attn_abi()}")
    if not lib.vpp_attn_cpu_ok():
        raise RuntimeError("this CPU has no AVX-512 F/DQ")
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.vpp_attn_f32.argtypes = [ptr] * 5 + [i64] * 15 + [ctypes.c_float, ctypes.c_int]
    lib.vpp_attn_f32.restype = ctypes.c_int
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernel, or None where it cannot run here (the reason: :func:`unavailable_reason`)."""
    return native.load_once(_state, _lock, _load, "vpp's CPU attention kernel",
                            "torch's CPU flash kernel runs instead")


def unavailable_reason() -> str | None:
    library()
    return _state["why"]


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :func:`attention` takes these tensors here (and the mode lets it)."""
    shapes_ok = (q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.float32 and q.dim() == 3
                 and v.shape[-1] % 16 == 0 and k.shape[0] > 0 and q.shape[0] % k.shape[0] == 0
                 and q.shape[1] > 0 and k.shape[1] > 0
                 and q.shape[0] // k.shape[0] * q.shape[1] >= MIN_ROWS)
    return native.usable(ENV, shapes_ok, library, _state, "vpp's CPU attention kernel")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, offset: int,
              threads: int | None = None, *, position_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale) v where query i sees keys j <= i + ``offset``: (output [Hq, Lq, Dv] fp32,
    log-sum-exp [Hq, Lq] fp32). Call :func:`supports` first. ``threads`` defaults to torch's.
    ``position_major``: the output is written [Lq, Hq, Dv] in memory (returned as its [Hq, Lq, Dv]
    view), so a caller that goes on with ``.transpose(0, 1)`` (positions, then heads) has it contiguous
    with no copy."""
    lib = library()
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if v.stride(1) != v.shape[-1]:
        # values are read a row per key in the kernel's innermost loop: rows far apart (MLA's expanded
        # values are a strided view, one key every heads x width floats) alias in the caches, so a copy
        # of O(keys x width) pays for itself (queries and keys are packed inside the kernel anyway)
        v = v.contiguous()
    hq, lq, d = q.shape
    hk, lk, dv = v.shape
    if k.shape != (hk, lk, d):
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)} and v {tuple(v.shape)}")
    if q.device.type != "cpu" or k.device.type != "cpu" or v.device.type != "cpu":
        raise ValueError(f"vpp's CPU attention kernel takes CPU tensors, got {q.device}, {k.device}, {v.device}")
    # the device is given: under `with torch.device(...)` a bare empty() would land elsewhere
    if position_major:
        out = torch.empty(lq, hq, dv, dtype=torch.float32, device=q.device).transpose(0, 1)
    else:
        out = torch.empty(hq, lq, dv, dtype=torch.float32, device=q.device)
    lse = torch.empty(hq, lq, dtype=torch.float32, device=q.device)
    rc = lib.vpp_attn_f32(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), hq, hk, lq, lk,
                          d, dv, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                          out.stride(0), out.stride(1), int(offset), float(scale),
                          int(threads or torch.get_num_threads()))
    if rc:
        raise ValueError(f"vpp_attn_f32 refused q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} ({rc})")
    return out, lse


__all__ = ["ENV", "MIN_ROWS", "MODES", "attention", "build", "cache_dir", "library", "mode", "supports",
           "unavailable_reason"]
