"""Device and communication backend, chosen in one place.

=========  ==========  ===========================================================
device     backend     when chosen automatically
=========  ==========  ===========================================================
``npu``    ``hccl``    ``torch_npu`` imports and reports an available NPU
``cuda``   ``nccl``    ``torch.cuda.is_available()``
``cpu``    ``gloo``    otherwise (development and tests)
=========  ==========  ===========================================================

``torch_npu`` is imported only when an NPU is asked for or while probing; when it is missing the
probe quietly moves on, so CPU use never depends on it.

A process group knows its backend (``dist.get_backend(pg)``); :func:`accelerator_for_backend` maps it
back to the device kind whose tensors that backend moves, so code that holds a process group never
guesses the device from what the machine happens to have. gloo moves CPU tensors only (its CUDA
support does not cover point-to-point), so gloo always means CPU here.

Peak memory (:meth:`Accelerator.reset_peak_memory` / :meth:`Accelerator.peak_memory`): on CUDA and
NPU the caching allocator's ``max_memory_allocated`` (tensors only), and beside it
:meth:`Accelerator.peak_memory_reserved`, ``max_memory_reserved`` (what the allocator holds from the
device, its cache included; NCCL/HCCL's own buffers are outside both); on CPU torch keeps no allocator
statistics, so it is the process's peak resident set (Linux ``VmHWM``, reset through
``/proc/self/clear_refs``): it includes the interpreter, the libraries and every live tensor.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from functools import lru_cache

import torch

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
KINDS = {backend: kind for kind, backend in BACKENDS.items()}


@dataclass(frozen=True)
class Accelerator:
    """A device kind and the torch.distributed backend that goes with it."""

    kind: str  # "cpu" | "cuda" | "npu"
    backend: str  # "gloo" | "nccl" | "hccl"

    def device(self, local_rank: int = 0) -> torch.device:
        """The torch device this process should use (``local_rank`` selects the card)."""
        if self.kind == "cpu":
            return torch.device("cpu")
        return torch.device(self.kind, local_rank)

    def synchronize(self, device: torch.device | None = None) -> None:
        """Wait for queued kernels, so wall-clock timings mean something on accelerators."""
        if self.kind == "cuda":
            torch.cuda.synchronize(device)
        elif self.kind == "npu":
            torch.npu.synchronize(device)  # type: ignore[attr-defined]

    def module(self):
        """``torch.cuda`` or ``torch.npu`` (None on CPU): the device module with events and memory stats."""
        return None if self.kind == "cpu" else getattr(torch, self.kind)

    def event(self):
        """A timing event on this device (``record()``, ``elapsed_time(other)`` in ms), or None on CPU
        where kernels run synchronously in the calling thread and the host clock times them."""
        mod = self.module()
        return None if mod is None else mod.Event(enable_timing=True)

    def reset_peak_memory(self, device: torch.device | None = None) -> None:
        """Start a new peak-memory window (see the module docstring for what is measured)."""
        mod = self.module()
        if mod is not None:
            mod.reset_peak_memory_stats(device)
        else:
            _reset_peak_rss()

    def peak_memory(self, device: torch.device | None = None) -> int:
        """Peak bytes since :meth:`reset_peak_memory`: allocated tensors on CUDA/NPU, the process's
        peak resident set on CPU (0 where the OS does not report it)."""
        mod = self.module()
        if mod is not None:
            return int(mod.max_memory_allocated(device))
        return _status_bytes("VmHWM")

    def peak_memory_reserved(self, device: torch.device | None = None) -> int:
        """Peak bytes the caching allocator reserved since :meth:`reset_peak_memory` (CUDA/NPU); on CPU
        the same figure as :meth:`peak_memory`."""
        mod = self.module()
        if mod is not None:
            return int(mod.max_memory_reserved(device))
        return _status_bytes("VmHWM")

    @property
    def peak_memory_method(self) -> str:
        if self.kind == "cpu":
            return "process peak RSS (Linux VmHWM, reset via /proc/self/clear_refs)"
        return f"torch.{self.kind}.max_memory_allocated / max_memory_reserved where they differ (reset per run)"

    @property
    def device_count(self) -> int:
        if self.kind == "cuda":
            return torch.cuda.device_count()
        if self.kind == "npu":
            return torch.npu.device_count()  # type: ignore[attr-defined]
        return 1


def accelerator_for_backend(backend: str) -> Accelerator:
    """The accelerator whose tensors ``backend`` (a process group's, e.g. ``dist.get_backend(pg)``) moves."""
    backend = str(backend).lower()
    if backend not in KINDS:
        raise ValueError(f"process-group backend {backend!r} is not one of {sorted(KINDS)}")
    return Accelerator(kind=KINDS[backend], backend=backend)


def _status_bytes(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return 0
    return int(m.group(1)) * 1024 if m else 0


def _reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


@lru_cache(maxsize=None)
def npu_available() -> bool:
    """True when ``torch_npu`` imports and sees at least one NPU. Never raises."""
    try:
        importlib.import_module("torch_npu")
    except Exception:  # ImportError, or a broken CANN install: both mean "no NPU here"
        return False
    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available())


def get_accelerator(kind: str | None = None, backend: str | None = None) -> Accelerator:
    """Pick the device kind (``"cpu"``, ``"cuda"``, ``"npu"`` or ``None`` for automatic) and its backend.

    ``backend`` overrides the default pairing (for example ``mpi``); gloo with a device is refused.
    """
    if kind is None:
        kind = "npu" if npu_available() else "cuda" if torch.cuda.is_available() else "cpu"
    if kind not in BACKENDS:
        raise ValueError(f"unknown device kind {kind!r}; expected one of {sorted(BACKENDS)}")
    if kind == "npu" and not npu_available():
        raise RuntimeError("device 'npu' was asked for, but torch_npu is not importable or sees no NPU")
    if kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for, but torch.cuda.is_available() is False")
    if kind != "cpu" and backend == "gloo":
        raise ValueError(f"backend 'gloo' with device {kind!r}: gloo's point-to-point moves CPU tensors only; "
                         f"use {BACKENDS[kind]!r} (or device 'cpu')")
    return Accelerator(kind=kind, backend=backend or BACKENDS[kind])


__all__ = ["Accelerator", "BACKENDS", "KINDS", "accelerator_for_backend", "get_accelerator", "npu_available"]
