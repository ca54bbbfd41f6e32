"""How much scratch memory an attention layer may use for one chunk, and how that sizes its blocks.

MLA's prefix attention expands the cached latent to per-head keys and values, and DSA's indexer scores
every cached key for every query: both would grow with the prefix if done at once. Both work in blocks
instead (keys for MLA, queries for DSA) whose size follows a byte budget, so the scratch memory of a
chunk is bounded by the budget whatever the prefix (``benchmarks/memory.py`` measures it).

The budget of a module (:class:`UsesWorkspace`) is its ``workspace_bytes`` when set, else :func:`default_budget` of
the device: 1/64 of an accelerator's memory (2.2 GB on an H200, 1 GB on a 64 GB Ascend die: blocks of
thousands of keys, so a block is a few large kernels rather than many launch-bound ones), and 32 MiB on
a CPU, whose kernels are cache-blocked and gain nothing from larger blocks.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import nn

CPU_BUDGET = 32 << 20
DEVICE_SHARE = 64  # an accelerator's budget is its memory / DEVICE_SHARE


@lru_cache(maxsize=None)
def default_budget(device: torch.device) -> int:
    """Scratch bytes per attention call on ``device`` (see the module docstring)."""
    if device.type in ("cuda", "npu"):
        props = getattr(torch, device.type).get_device_properties(device)
        return int(props.total_memory) // DEVICE_SHARE
    return CPU_BUDGET


class UsesWorkspace:
    """Mixin of a module whose scratch memory per call is bounded by ``workspace_bytes`` bytes (None:
    :func:`default_budget` of the device it runs on)."""

    workspace_bytes: int | None = None

    def workspace_budget(self, device: torch.device) -> int:
        return int(self.workspace_bytes) if self.workspace_bytes is not None else default_budget(device)


def rows_per_block(budget: int, bytes_per_row: int) -> int:
    """How many rows of ``bytes_per_row`` fit the budget (at least one)."""
    return max(1, budget // max(1, bytes_per_row))


def set_workspace_bytes(model: nn.Module, nbytes: int | None) -> int:
    """Give every module under ``model`` that uses a workspace the budget ``nbytes`` (None: the device
    default); returns how many modules took it."""
    if nbytes is not None and nbytes < 1:
        raise ValueError(f"workspace budget {nbytes} bytes must be >= 1")
    count = 0
    for m in model.modules():
        if isinstance(m, UsesWorkspace):
            m.workspace_bytes = nbytes
            count += 1
    return count


__all__ = [
    "CPU_BUDGET", "DEVICE_SHARE", "UsesWorkspace", "default_budget", "rows_per_block", "set_workspace_bytes",
]
