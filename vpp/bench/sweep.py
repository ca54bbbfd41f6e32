"""Sweeps over lengths x chunk budgets x strategies, the paper's "best budget per strategy" rule, and the
standard setups of the paper's deployment (TP8 + PP2 on 16 Ascend 910C NPUs)."""

from __future__ import annotations

from dataclasses import dataclass

from vpp.perf.arch import Arch
from vpp.perf.configs import canonical_name, get_config
from vpp.perf.hardware import ASCEND_910C, Device
from vpp.perf.ops import Parallel
from vpp.perf.runs import Setup, run

from .fit import Fit, fit_cpp

# Weight formats: DeepSeek-V3.1 (671B) and GLM-5.2 (744B) do not fit 16 x 64 GB in BF16, so W8A8 (the
# usual vLLM-Ascend format for them) is assumed; Qwen3-Coder-30B-A3B (61 GB in BF16) runs in BF16.
WEIGHT_BYTES = {"deepseek-v3.1": 1, "glm-5.2": 1, "qwen3-coder-30b-a3b": 2}
# KV cache: with a BF16 cache DeepSeek-V3.1 at 512K needs ~64.3 GB on its busiest NPU, over the 910C's
# 64 GB, yet the paper ran it: an 8-bit cache (vLLM-Ascend's C8 with W8A8) is assumed for the W8A8 models.
KV_BYTES = {"deepseek-v3.1": 1, "glm-5.2": 1, "qwen3-coder-30b-a3b": 2}
MODELS = tuple(WEIGHT_BYTES)


def paper_setup(model: str, device: Device = ASCEND_910C, *, tp: int = 8, pp: int = 2) -> Setup:
    model = canonical_name(model)
    cfg = get_config(model)
    par = Parallel(tp=tp, weight_bytes=WEIGHT_BYTES.get(model, 2), kv_bytes=KV_BYTES.get(model, 2))
    return Setup(Arch.from_config(cfg, name=model), device, par, pp)


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


def sweep(setups: dict, strategies, lengths, chunks, *, models=None) -> list[Point]:
    out = []
    for model in models or list(setups):
        for length in lengths:
            for chunk in chunks:
                for strategy in strategies:
                    r = run(setups[model], strategy, [length], chunk)
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


__all__ = [
    "KV_BYTES", "MODELS", "Point", "WEIGHT_BYTES", "at", "best", "fitted_setups", "paper_setup", "sweep",
]
