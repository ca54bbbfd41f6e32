"""Sweeps over lengths x chunk budgets x strategies, the paper's "best budget per strategy" rule, and the
standard setups of the paper's deployment (TP8 + PP2 on 16 Ascend 910C NPUs)."""

from __future__ import annotations

from dataclasses import dataclass

from vpp.perf.hardware import ASCEND_910C, Device
from vpp.perf.runs import MODELS, paper_setup, run

from .fit import Fit, fit_cpp
from .jobs import pmap


def fitted_setups(device: Device = ASCEND_910C) -> tuple[dict, Fit]:
    """Setups of the three models on a device whose eff_attn / eff_link are fitted on DeepSeek's CPP row
    (one device, so the same constants serve every model)."""
    ds, fit = fit_cpp(paper_setup("deepseek-v3.1", device))
    return {m: paper_setup(m, ds.device) for m in MODELS}, fit


@dataclass
class Point:
    model: str
    strategy: str
    length: int
    chunk: int
    row: object


def sweep(setups: dict, strategies, lengths, chunks, *, models=None, jobs: int = 1) -> list[Point]:
    """Every (model, length, chunk, strategy) run, in that order; each (model, length) a piece of its own
    on up to ``jobs`` processes (:func:`.jobs.pmap`)."""
    pieces = [(model, setups[model], length, tuple(chunks), tuple(strategies))
              for model in models or list(setups) for length in lengths]
    return [p for points in pmap(_sweep_length, pieces, jobs) for p in points]


def _sweep_length(piece) -> list[Point]:
    model, setup, length, chunks, strategies = piece
    out = []
    for chunk in chunks:
        for strategy in strategies:
            r = run(setup, strategy, [length], chunk)
            if r is not None:
                out.append(Point(model, strategy, length, chunk, r.row))
    return out


def best(points: list[Point], model: str, strategy: str, length: int) -> Point | None:
    """The budget with the lowest TTFT for this strategy (the paper reports each strategy at its best)."""
    cands = [p for p in points if (p.model, p.strategy, p.length) == (model, strategy, length)]
    return min(cands, key=lambda p: p.row.total) if cands else None


def at(points: list[Point], model: str, strategy: str, length: int, chunk: int) -> Point | None:
    for p in points:
        if (p.model, p.strategy, p.length, p.chunk) == (model, strategy, length, chunk):
            return p
    return None


__all__ = ["Point", "at", "best", "fitted_setups", "sweep"]
