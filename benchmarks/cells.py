"""The paper's numbers cell by cell against the model: paper | model | error | fitted or predicted.

A :class:`Cell` holds one published number (a point, a ``(lo, hi)`` range the paper's claim spans, or
None where the paper gives only words) and the model's value for the same quantity, in the paper's own
metric (seconds per rank for Tables 1 and 2, throughput gains for the sweeps, step counts). ``status``
is "fitted" for the three cells the device constants are fitted on (:mod:`vpp.bench.fit`), "derived"
for cells whose model value follows from a fitted cell or from arithmetic alone (the launch-stall deltas,
CPP's step count, Table 2(a)'s repeat of Table 1's DCPP column), and "predicted" for every other. The error of a point is relative, ``(model - paper) / |paper|``; of a
range, the distance to the nearer end relative to it (0 inside). A cell is *reproduced* when it is
predicted and its error is within the tolerance (10% by default), or, for numbers near zero where a
relative error means nothing, when it is within :data:`ABS_TOL` of the paper (10 ms, 0.1 points).

The builders take simulated rows (:class:`vpp.perf.decompose.Row`, profiler view) and sweep points
(:mod:`vpp.bench.sweep`) and return lists of cells; :func:`markdown` renders them.
"""

from __future__ import annotations

from dataclasses import dataclass

from vpp.plan import strategies

from vpp.bench import paper
from vpp.bench.sweep import Point, best

TOL = 0.10
ABS_TOL = {"s": 0.01, "%": 0.1}
FITTED = {("Table 1", "CPP computation"), ("Table 1", "CPP exposed comm."), ("Table 2(c)", "DCPP Launch stall")}


@dataclass(frozen=True)
class Cell:
    section: str
    row: str
    paper: object
    model: float | None
    unit: str = "s"
    note: str = ""
    derived: bool = False

    @property
    def status(self) -> str:
        if (self.section, self.row) in FITTED:
            return "fitted"
        return "derived" if self.derived else "predicted"

    @property
    def error(self) -> float | None:
        if self.model is None or self.paper is None or isinstance(self.paper, str):
            return None
        if isinstance(self.paper, tuple):
            lo, hi = self.paper
            if lo <= self.model <= hi:
                return 0.0
            end = lo if self.model < lo else hi
            return (self.model - end) / abs(end) if end else None
        return (self.model - self.paper) / abs(self.paper) if self.paper else None

    def reproduced(self, tol: float = TOL) -> bool:
        if self.status != "predicted" or self.error is None:
            return False
        close = isinstance(self.paper, (int, float)) and abs(self.model - self.paper) <= ABS_TOL.get(self.unit, 0.0)
        return abs(self.error) <= tol or close

    def to_dict(self) -> dict:
        return {"section": self.section, "row": self.row, "paper": self.paper, "model": self.model,
                "unit": self.unit, "error": self.error, "status": self.status, "note": self.note}


def _fmt(v, unit: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, tuple):
        return f"{_fmt(v[0], unit)} .. {_fmt(v[1], unit)}"
    if unit == "%":
        return f"{v:+.2f}%" if abs(v) < 1 else f"{v:+.1f}%"
    if unit in ("steps", "cells"):
        return f"{v:.0f}"
    if unit == "x":
        return f"{v:.2f}x"
    return f"{v:.2f}"


def markdown(cells: list[Cell], tol: float = TOL) -> str:
    """One table: section, quantity, paper, model, error, fitted / predicted, reproduced, note."""
    lines = ["| table | quantity | paper | model | error | fitted / predicted | within 10% | note |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        err = "-" if c.error is None else f"{100 * c.error:+.1f}%"
        ok = "-" if c.status != "predicted" or c.error is None else ("yes" if c.reproduced(tol) else "**no**")
        lines.append(f"| {c.section} | {c.row} | {_fmt(c.paper, c.unit)} | {_fmt(c.model, c.unit)} | {err} | "
                     f"{c.status} | {ok} | {c.note} |")
    return "\n".join(lines)


def summary(cells: list[Cell], tol: float = TOL) -> dict:
    scored = [c for c in cells if c.status == "predicted" and c.error is not None]
    good = [c for c in scored if c.reproduced(tol)]
    return {"cells": len(cells), "fitted": sum(c.status == "fitted" for c in cells),
            "derived": sum(c.status == "derived" for c in cells), "scored": len(scored),
            "reproduced": len(good), "missed": [f"{c.section}: {c.row}" for c in scored if not c.reproduced(tol)]}


# -- Tables 1 and 2 ---------------------------------------------------------------------------------------
PARTS = (("computation", "compute"), ("bubble", "bubble"), ("exposed comm.", "exposed_comm"), ("total", "total"))


def table_cells(rows: dict) -> list[Cell]:
    """Tables 1, 2(a), 2(b), 2(c) and the overlap ratios of the 512K DeepSeek run. ``rows`` maps
    "cpp", "dcpp", "vpp-async" to rows (the paper's VPP is VPP-Async: its 51.75% overlap says so)."""
    P, cells = paper.TABLE_512K, []
    c, d, v = rows["cpp"], rows["dcpp"], rows["vpp-async"]
    for label, key in PARTS:
        pc, pd = P["cpp"][key], P["dcpp"][key]
        mc, md = getattr(c, key), getattr(d, key)
        cells += [Cell("Table 1", f"CPP {label}", pc, mc), Cell("Table 1", f"DCPP {label}", pd, md),
                  Cell("Table 1", f"delta {label}", pd - pc, md - mc),
                  Cell("Table 1", f"delta/CPP {label}", 100 * (pd - pc) / pc, 100 * (md - mc) / mc, "%")]
    for label, key in PARTS:
        pd, pv = P["dcpp"][key], P["vpp"][key]
        md, mv = getattr(d, key), getattr(v, key)
        if key != "total":
            cells += [Cell("Table 2(a)", f"DCPP {label}", pd, md, note="= Table 1", derived=True),
                      Cell("Table 2(a)", f"VPP {label}", pv, mv, note="model: VPP-Async")]
        cells += [Cell("Table 2(a)", f"delta {label}", pv - pd, mv - md),
                  Cell("Table 2(a)", f"delta/DCPP {label}", 100 * (pv - pd) / pd, 100 * (mv - md) / md, "%")]
    D = paper.COMPUTE_DETAIL_512K
    for kernel, cat, note in (("Attention", "attention", "attention kernels and merges"),
                              ("Slice", "prefix_mem", "model: MLA prefix gather + split/concat copies"),
                              ("MatMulV3", "prefix_gemm", "model: MLA prefix up-projection GEMM")):
        pd, pv = D["dcpp"][kernel], D["vpp"][kernel]
        md, mv = d.categories.get(cat, 0.0), v.categories.get(cat, 0.0)
        cells += [Cell("Table 2(b)", f"DCPP {kernel}", pd, md, note=note), Cell("Table 2(b)", f"VPP {kernel}", pv, mv),
                  Cell("Table 2(b)", f"delta {kernel}", pv - pd, mv - md),
                  Cell("Table 2(b)", f"delta/DCPP {kernel}", 100 * (pv - pd) / pd, 100 * (mv - md) / md if md else None, "%")]
    B = paper.BUBBLE_DETAIL_512K
    for part, attr in (("Free", "free"), ("Launch stall", "launch_stall")):
        pd, pv = B["dcpp"][part], B["vpp"][part]
        md, mv = getattr(d, attr), getattr(v, attr)
        stall = part == "Launch stall"      # its deltas follow from the fitted DCPP cell and VPP's async scheduler
        cells += [Cell("Table 2(c)", f"DCPP {part}", pd, md), Cell("Table 2(c)", f"VPP {part}", pv, mv),
                  Cell("Table 2(c)", f"delta {part}", pv - pd, mv - md, derived=stall),
                  Cell("Table 2(c)", f"delta/DCPP {part}", 100 * (pv - pd) / pd, 100 * (mv - md) / md if md else None,
                       "%", derived=stall)]
    O = paper.OVERLAP_RATIO_512K
    cells += [Cell("Table 2 text", "DCPP overlap ratio", 100 * O["dcpp"], 100 * d.overlap_ratio, "%"),
              Cell("Table 2 text", "VPP overlap ratio", 100 * O["vpp"], 100 * v.overlap_ratio, "%")]
    return cells


def steps_cells(cpp_128k: int, dcpp_128k: int, cpp_512k: int, dcpp_512k: int, allgather_ratio: float) -> list[Cell]:
    """Fig. 1(b) and the step / AllGather-call ratios of Sec. 4 and 6.3."""
    return [Cell("Fig. 1(b)", "CPP steps, 128K (16K budget)", paper.STEPS["cpp_128k"], cpp_128k, "steps",
                 "128K / 16K", derived=True),
            Cell("Fig. 1(b)", "DCPP steps, 128K (16K budget)", paper.STEPS["dcpp_128k"], dcpp_128k, "steps"),
            Cell("Sec. 4", "DCPP / CPP steps, 512K (24K budget)", paper.STEPS["dcpp_over_cpp_512k"],
                 dcpp_512k / cpp_512k, "x"),
            Cell("Table 2 text", "AllGather calls DCPP / VPP", paper.ALLGATHER_512K["calls_dcpp_over_vpp"],
                 allgather_ratio, "x", "model: PP hand-over all-gathers per rank")]


# -- the long-sequence sweep ------------------------------------------------------------------------------
def throughput_gain(points: list[Point], model: str, of: str, over: str, length: int) -> float | None:
    """Throughput gain of ``of`` over ``over`` at their best budgets (single request: TTFT ratio - 1)."""
    a, b = best(points, model, of, length), best(points, model, over, length)
    if a is None or b is None:
        return None
    return b.row.total / a.row.total - 1.0


def sweep_cells(points: list[Point], vpp: str = "vpp-async") -> list[Cell]:
    """Every long-sequence claim of the paper, in its metric (throughput gain, %)."""
    cells = []
    for (model, of, over), claims in paper.LONG_GAINS.items():
        strat = vpp if of == "vpp" else of
        name = f"{model}: {'VPP' if of == 'vpp' else of.upper()} over {over.upper()}"
        for length, value in claims.items():
            pv = tuple(100 * x for x in value) if isinstance(value, tuple) else 100 * value
            if length == "max":
                gains = [throughput_gain(points, model, strat, over, L) for L in paper.LONG_LENGTHS[model]]
                gains = [g for g in gains if g is not None]
                cells.append(Cell("Sweep", f"{name}, largest over lengths", pv, 100 * max(gains) if gains else None, "%"))
            else:
                g = throughput_gain(points, model, strat, over, length)
                cells.append(Cell("Sweep", f"{name}, {length // 1024}K", pv, None if g is None else 100 * g, "%"))
    return cells


def chunk_cells(points: list[Point], vpp: str = "vpp-async") -> list[Cell]:
    """The 24K tail effect: in how many (model, length) cells the paper's reported lengths make 24K
    VPP's best budget ("most": more than half)."""
    cells_ = [(m, L) for m, Ls in paper.LONG_LENGTHS.items() for L in Ls]
    wins = sum(best(points, m, vpp, L).chunk == 24576 for m, L in cells_ if best(points, m, vpp, L) is not None)
    return [Cell("Chunk sensitivity", f"cells where 24K is VPP's best budget (of {len(cells_)})",
                 (len(cells_) // 2 + 1, len(cells_)), wins, "cells", "paper: 24K best in most configurations")]


def required_step_cost(slow: float, fast: float, steps: int, target_gain: float) -> float:
    """Extra seconds per step that ``steps`` steps of the slower strategy would need so that the faster
    one gains ``target_gain`` in throughput: ((1 + gain) fast - slow) / steps."""
    return ((1.0 + target_gain) * fast - slow) / steps


# -- ablation and request streams -------------------------------------------------------------------------
def ablation_cells(rows: dict) -> list[Cell]:
    """Sec. 6.4: 3 x 256K DeepSeek requests in 32K chunks; ``rows`` maps "vpp", "vpp-async",
    "vpp-packed" to rows (profiler view)."""
    A, base = paper.ABLATION_256K, rows["vpp"].total
    cells = [Cell("Ablation", "VPP-Async latency reduction vs VPP", 100 * A["async_gain"],
                  100 * (base - rows["vpp-async"].total) / base, "%"),
             Cell("Ablation", "VPP-Async + packing reduction vs VPP", 100 * A["packing_gain_total"],
                  100 * (base - rows["vpp-packed"].total) / base, "%")]
    for s in ("vpp", "vpp-async", "vpp-packed"):
        label = strategies.get(s).label
        cells.append(Cell("Ablation", f"{label} bubble ratio", 100 * A["bubble_ratio"][s], 100 * rows[s].bubble_ratio, "%"))
    return cells


def stream_cells(results: dict) -> list[Cell]:
    """Fig. 3: ``results[(model, workload)]`` maps strategies to :class:`vpp.bench.serving.Served` (each at
    its best budget); workloads "mixed", "short-4K", "short-8K", "short-16K". The paper's VPP is VPP-Async
    + packing; gains are throughput gains."""
    def g(model, wl, over):
        rows = results.get((model, wl))
        return None if rows is None else 100 * (rows["vpp-packed"].stats.throughput / rows[over].stats.throughput - 1)

    cells = []
    for (model, over), value in paper.MIXED_GAINS.items():
        pv = tuple(100 * x for x in value) if isinstance(value, tuple) else 100 * value
        cells.append(Cell("Fig. 3 mixed", f"{model}: VPP over {over.upper()}", pv, g(model, "mixed", over), "%"))
    shorts = ("short-4K", "short-8K", "short-16K")
    qwen = [x for x in (g("qwen3-coder-30b-a3b", w, "cpp") for w in shorts) if x is not None]
    ds = [x for x in (g("deepseek-v3.1", w, "dcpp") for w in shorts) if x is not None]
    worst = [x for m in paper.MODELS_ALL for w in shorts for x in [g(m, w, "dcpp")] if x is not None]
    cells += [Cell("Fig. 3 short", "Qwen: VPP over CPP, worst length", 100 * paper.SHORT_CLAIMS["qwen_vs_cpp_worst"],
                   min(qwen) if qwen else None, "%"),
              Cell("Fig. 3 short", "DeepSeek: VPP over DCPP, best length", 100 * paper.SHORT_CLAIMS["deepseek_vs_dcpp_best"],
                   max(ds) if ds else None, "%"),
              Cell("Fig. 3 short", "VPP over DCPP, worst model and length", paper.SHORT_CLAIMS["vs_dcpp"],
                   min(worst) if worst else None, "%")]
    return cells


def chunk_cost_window(runs: dict[int, tuple[float, int]], target: int = 24576) -> tuple[float, float] | None:
    """The per-chunk cost x (seconds) that, added to every chunk, makes ``target`` the best budget:
    ``runs[budget] = (TTFT, chunks)``; T_t + N_t x <= T_b + N_b x for every budget b. None if no x >= 0 does."""
    t, n = runs[target]
    lo, hi = 0.0, float("inf")
    for b, (tb, nb) in runs.items():
        if b == target:
            continue
        if nb > n:
            lo = max(lo, (t - tb) / (nb - n))
        elif nb < n:
            hi = min(hi, (tb - t) / (n - nb))
        elif tb < t:
            return None
    return (lo, hi) if lo <= hi else None
