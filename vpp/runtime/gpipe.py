"""An outside reference: torch.distributed.pipelining's GPipe running vpp's own stage modules.

Each chunk of the prompt is one micro-batch, so GPipe's forward-only schedule (``eval``) is exactly
CPP over a loop layout, executed by PyTorch's pipeline runtime instead of vpp's. Chunks must be of
equal size (micro-batches are equal splits). Shapes are given explicitly (``input_args`` /
``output_args``) so that PipelineStage's shape inference never calls the stage, which would write a
dummy chunk into the KV cache.
"""

from __future__ import annotations

import torch
from torch import nn

from vpp.parallel.groups import ParallelGroups


class _ChunkedRequest(nn.Module):
    """Adapts the stage contract ``stage(x, request, offset)`` to a plain ``forward(x)``: the
    micro-batches of one request arrive in order, so the offset is the tokens seen so far."""

    def __init__(self, stage: nn.Module, request: int):
        super().__init__()
        self.stage, self.request, self.offset = stage, request, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stage(x, self.request, self.offset, **({"last_token_only": True} if self.stage.is_last else {}))
        self.offset += x.shape[0]
        return out.clone()  # leave inference mode's tensors behind


def gpipe_prefill(stage: nn.Module, input_ids: torch.Tensor | None, chunk_size: int, seq_len: int,
                  groups: ParallelGroups, *, request: int = 0) -> torch.Tensor | None:
    """Prefill ``seq_len`` tokens (a multiple of ``chunk_size``) through one stage per pipeline rank
    with ``ScheduleGPipe.eval``; returns the last-token logits on the last rank, else None."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    if seq_len % chunk_size:
        raise ValueError(f"GPipe needs equal micro-batches: seq_len={seq_len} is not a multiple of "
                         f"chunk_size={chunk_size}")
    n = seq_len // chunk_size
    hidden, dtype, dev = stage.hidden_size, stage.dtype, groups.device
    x_in = torch.zeros(chunk_size, dtype=torch.long, device=dev) if stage.is_first else \
        torch.zeros(chunk_size, hidden, dtype=dtype, device=dev)
    x_out = torch.zeros(1, stage.vocab_size, dtype=dtype, device=dev) if stage.is_last else \
        torch.zeros(chunk_size, hidden, dtype=dtype, device=dev)
    wrapped = _ChunkedRequest(stage, request)
    pipe_stage = PipelineStage(wrapped, groups.pp.rank, groups.pp.size, groups.device,
                               input_args=(x_in,), output_args=(x_out,), group=groups.pp.pg)
    schedule = ScheduleGPipe(pipe_stage, n_microbatches=n)
    with torch.no_grad():
        out = schedule.eval(input_ids.to(dev)) if stage.is_first else schedule.eval()
    if stage.is_last:
        return out[-1]
    return None


__all__ = ["gpipe_prefill"]
