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
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache

import torch

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


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

    @property
    def device_count(self) -> int:
        if self.kind == "cuda":
            return torch.cuda.device_count()
        if self.kind == "npu":
            return torch.npu.device_count()  # type: ignore[attr-defined]
        return 1


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

    ``backend`` overrides the default pairing (for example ``gloo`` on CUDA for debugging).
    """
    if kind is None:
        kind = "npu" if npu_available() else "cuda" if torch.cuda.is_available() else "cpu"
    if kind not in BACKENDS:
        raise ValueError(f"unknown device kind {kind!r}; expected one of {sorted(BACKENDS)}")
    if kind == "npu" and not npu_available():
        raise RuntimeError("device 'npu' was asked for, but torch_npu is not importable or sees no NPU")
    if kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for, but torch.cuda.is_available() is False")
    return Accelerator(kind=kind, backend=backend or BACKENDS[kind])
