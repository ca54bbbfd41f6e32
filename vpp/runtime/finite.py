"""Non-finite numbers are never a result: NaN or Inf in a stage's output stops the run on every rank,
naming the first stage whose output stopped being finite.

During a prefill, each rank keeps one flag per (stage, request) on its device: after every compute
the flag is or-ed with "this output holds a NaN or an Inf" (one reduction over the chunk's output,
no synchronisation per chunk). After the run, the flags are read once and shared with one small
exchange (``all_gather_object``), so every rank raises the same :class:`NonFiniteError`. Stage ``s+1``
reads stage ``s``'s output, so once a stage's output is not finite every later stage's is not either:
the lowest such stage is where it started. (A stage may still turn a finite input into a non-finite
output only for some chunks: the flag covers every chunk of the request.)

Decoding broadcasts the next-token logits to every rank, so every rank sees the same non-finite
logits and raises alike; only then (never on the good path) do the ranks exchange their per-stage
flags to name the stage.
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import torch

from vpp.transformer.basic import all_finite


class NonFiniteError(RuntimeError):
    """NaN or Inf came out of a stage. ``stage``: the first stage (in pipeline order) whose output was
    not finite; ``layers``: its layer range; ``pp_rank``: the pipeline rank holding it; ``request``: the
    first request affected; ``what``: which call (prefill, decode); ``layer``: the first layer whose output
    was not finite, when the stage module can tell (``stage.nonfinite_layer(request)``), else None."""

    def __init__(self, message: str, *, stage: int | None = None, layers: tuple[int, int] | None = None,
                 pp_rank: int | None = None, request: Hashable = None, what: str = "prefill",
                 layer: int | None = None):
        super().__init__(message)
        self.stage, self.layers, self.pp_rank, self.request, self.what = stage, layers, pp_rank, request, what
        self.layer = layer


class FiniteWatch:
    """Per-(stage, request) device flags of one rank; see the module docstring."""

    def __init__(self) -> None:
        self._flags: dict[tuple[int, Hashable], torch.Tensor] = {}

    def observe(self, stage: int, request: Hashable, out: torch.Tensor) -> None:
        bad = ~all_finite(out)
        key = (stage, request)
        prev = self._flags.get(key)
        self._flags[key] = bad if prev is None else prev | bad

    def local(self) -> list[tuple[int, Any]]:
        """(stage, request) pairs whose output was not finite on this rank (one host read for all)."""
        if not self._flags:
            return []
        keys = list(self._flags)
        values = torch.stack([self._flags[k] for k in keys]).cpu().tolist()
        return [k for k, v in zip(keys, values) if v]


def first_nonfinite(found: Sequence[Sequence[tuple]]) -> tuple | None:
    """The lowest stage (then the first request seen there) among every rank's (stage, request,
    layer or None) triples."""
    triples = [p for rank in found for p in (rank or ())]
    if not triples:
        return None
    stage = min(t[0] for t in triples)
    return next(t for t in triples if t[0] == stage)


def raise_nonfinite(first: tuple, layout, stage_layers: dict[int, tuple[int, int]], *,
                    what: str = "prefill") -> None:
    """Raise the :class:`NonFiniteError` of ``first`` = (stage, request, first bad layer or None)."""
    stage, request, layer = first
    layers = stage_layers.get(stage)
    rank = layout.rank_of(stage)
    where = f"stage {stage}" + (f" (layers [{layers[0]}, {layers[1]}))" if layers else "") + f" on pipeline rank {rank}"
    if layer is not None:
        where = f"layer {layer} in {where}"
    later = "; every later stage's output follows" if stage < layout.last_stage else ""
    raise NonFiniteError(f"non-finite values (NaN or Inf) in the {what}: the output of {where} stopped being "
                         f"finite for request {request!r}{later} (check the weights of those layers, or the dtype's "
                         f"range)", stage=stage, layers=layers, pp_rank=rank, request=request, what=what,
                          layer=layer)


def check_logits(logits: torch.Tensor, requests: Sequence[Hashable]) -> list[Hashable]:
    """The requests whose rows of ``logits`` [B, vocab] hold a NaN or an Inf."""
    bad = (~torch.isfinite(logits.reshape(len(requests), -1))).any(-1).tolist()
    return [q for q, b in zip(requests, bad) if b]


__all__ = ["FiniteWatch", "NonFiniteError", "check_logits", "first_nonfinite", "raise_nonfinite"]
