"""What a prefill returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vpp.schedules.ir import Plan
from vpp.schedules.trace import Trace

from .executor import ExecutionResult


@dataclass
class PrefillOutput:
    """``logits``: last-token logits [vocab] of the (first) request on the ranks holding the last stage,
    else None; ``all_logits``: request id -> logits; ``plan``: the plan that ran; ``trace``: the whole
    pipeline's trace (when asked for); ``wall_s``: this rank's time from the start barrier to the end."""

    logits: torch.Tensor | None
    all_logits: dict[int, torch.Tensor]
    plan: Plan
    result: ExecutionResult
    trace: Trace | None
    wall_s: float


__all__ = ["PrefillOutput"]
