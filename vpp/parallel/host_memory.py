"""Host memory that stays with the process: glibc's allocator told to keep freed blocks for reuse.

Why. A CPU rank allocates and frees the same few-megabyte tensors for every layer of every chunk
(activations, the MoE's gathered rows, attention outputs). glibc serves blocks above its mmap
threshold with a fresh ``mmap`` and gives them back with ``munmap`` (or trims the heap's top past its
trim threshold), so the next block of that size page-faults every page again. glibc raises the
threshold by itself after the first such free, but not reliably in a rank process (measured: an 8K
prefill of ``benchmarks/vs_vllm.py``'s Qwen3-MoE took 2.71-2.80 s in a spawned rank against 2.60-2.65
s with both thresholds fixed, and the same 2.58 s either way in a plain process; the profile showed
the difference in ``silu``, ``mul`` and ``mm`` outputs, not in the arithmetic). vLLM's CPU guide
preloads tcmalloc for the same reason; this does it with glibc's own knobs, and only these two:

* ``M_MMAP_THRESHOLD`` = 64 MiB (glibc's own dynamic threshold stops at 32 MiB, so a block between the
  two is mapped and unmapped afresh every time by default): blocks below it come from the heap;
* ``M_TRIM_THRESHOLD`` = 1 GiB: freed memory at the heap's top stays mapped up to that much.

The cost is that a rank's resident memory stays at its peak (as PyTorch's caching allocators do on
accelerators). :func:`~vpp.parallel.rendezvous.init_distributed` applies it to every CPU rank;
``VPP_HOST_MALLOC=default`` leaves glibc's settings alone. Elsewhere (not glibc: macOS, musl) it
does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

ENV = "VPP_HOST_MALLOC"
MODES = ("keep", "default")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 1 << 30

_applied: dict = {}


def mode() -> str:
    value = os.environ.get(ENV, "keep").strip().lower() or "keep"
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r} is not one of {MODES}")
    return value


def keep_freed_host_memory() -> str:
    """Apply the settings above to this process (once; later calls repeat the first answer). Returns
    what happened: ``"kept"``, ``"default"`` (``VPP_HOST_MALLOC=default``) or why it could not
    (``"not glibc"``, ``"mallopt refused ..."``)."""
    if "result" not in _applied:
        _applied["result"] = _apply()
    return _applied["result"]


def _apply() -> str:
    if mode() == "default":
        return "default"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        gnu = ctypes.CDLL(None).gnu_get_libc_version  # glibc only: musl and macOS have no such symbol
    except (OSError, AttributeError):
        return "not glibc"
    del gnu
    refused = [name for name, key, value in (("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                             ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, TRIM_THRESHOLD))
               if libc.mallopt(key, value) != 1]
    return "kept" if not refused else f"mallopt refused {', '.join(refused)}"


__all__ = ["ENV", "MODES", "keep_freed_host_memory", "mode"]
