"""The layout a pipeline's stage modules form, read off their descriptors (:mod:`.handshake`).

Inference is for the API, which gets stage modules without a layout (:func:`vpp.runtime.forward_prefill`,
:class:`vpp.runtime.Pipeline`). A command chooses its run's layout once
(:func:`vpp.models.run_layout.layout_for`) and builds the stages from it; :func:`check_agrees` then
checks that the layout the executed plan ran on (inferred) is the one chosen."""

from __future__ import annotations

from typing import Sequence

from vpp.schedules.layout import Layout, stage_ranks_for

from . import handshake


def infer_layout(pipeline: Sequence[handshake.RankInfo]) -> Layout:
    """The layout the stage modules describe: stages ordered by first layer, each on the pipeline rank
    that holds it. Raises (with the layer ranges) when they do not tile the model."""
    held = sorted((st.layer_range, rank) for rank, info in enumerate(pipeline) for st in info.stages)
    if not held:
        raise ValueError("no rank holds a stage")
    ranges = tuple(r for r, _ in held)
    ranks = tuple(rank for _, rank in held)
    num_layers = ranges[-1][1]
    P = len(pipeline)
    kind, folds = "custom", len(ranges) // (2 * P) if len(ranges) % (2 * P) == 0 else 1
    for k, f in (("loop", 1), ("v", folds), ("interleaved", folds)):
        try:
            if stage_ranks_for(k, P, f) == ranks:
                kind, folds = k, f
                break
        except ValueError:
            continue
    by_rank = {r: [list(st.layer_range) for st in info.stages] for r, info in enumerate(pipeline)}
    try:
        layout = Layout(kind=kind, num_ranks=P, num_layers=num_layers, folds=folds,
                        stage_ranks=ranks, stage_layers=ranges)
    except ValueError as exc:
        raise ValueError(f"stage modules do not form a pipeline ({exc}); layer ranges by pipeline rank: "
                         f"{by_rank}") from None
    ends = {st.layer_range: st for info in pipeline for st in info.stages}
    first, last = ends[ranges[0]], ends[ranges[-1]]
    if not first.is_first or not last.is_last:
        what = ("the first stage holds no embedding (is_first=False)" if not first.is_first else
                f"the last stage {list(ranges[-1])} holds no LM head (is_last=False): the layers from {num_layers} "
                f"on are missing")
        raise ValueError(f"stage modules do not form a whole model: {what}; layer ranges by pipeline rank: {by_rank}")
    return layout


def check_agrees(chosen: Layout, inferred: Layout, what: str = "the run") -> None:
    """Raise when the layout inferred from the stage modules is not the ``chosen`` one."""
    if (chosen.num_ranks, chosen.stage_ranks, chosen.stage_layers) != \
            (inferred.num_ranks, inferred.stage_ranks, inferred.stage_layers):
        raise ValueError(f"{what}: the stage modules form {inferred.describe()} (layers {list(inferred.stage_layers)} "
                         f"on ranks {list(inferred.stage_ranks)}), not the chosen {chosen.describe()} (layers "
                         f"{list(chosen.stage_layers)} on ranks {list(chosen.stage_ranks)})")


def check_stage_shapes(pipeline: Sequence[handshake.RankInfo]) -> None:
    """All stages of a pipeline must agree on hidden size and dtype (activations flow between them)."""
    seen = {(st.hidden_size, st.dtype) for info in pipeline for st in info.stages}
    if len(seen) > 1:
        detail = {r: [(list(st.layer_range), st.hidden_size, st.dtype) for st in info.stages]
                  for r, info in enumerate(pipeline)}
        raise ValueError(f"stages disagree on (hidden size, dtype): {detail}")


__all__ = ["check_agrees", "check_stage_shapes", "infer_layout"]
