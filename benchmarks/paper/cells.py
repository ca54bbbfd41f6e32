"""The paper's numbers cell by cell against the model, each scored once, each saying what it is.

A :class:`Cell` holds one published number (a point, a ``(lo, hi)`` range the paper's claim spans) and
the model's value for the same quantity, in the paper's own metric (seconds per rank for Tables 1 and 2,
throughput gains for the sweeps and streams, step counts, ratios). Its ``status`` says what the model
value is (set by :func:`assign`, from what the fit touches, not from a hand list):

* ``fitted``     -- a device constant was fitted so that this cell equals the paper (:mod:`benchmarks.paper.fit`);
* ``derived``    -- the cell moves one for one with a fitted cell when the fitted constant moves (it
  restates the fit up to small terms: VPP's computation is CPP's, the Attention rows are the fitted
  computation less small terms);
* ``structural`` -- built into the model whatever the constants (a zero no constant can move, the step
  count of fixed chunking);
* ``predicted``  -- everything else: the only cells the score counts.

A cell is ``within`` tolerance when, for a percentage *gain* (``gain=True``: a throughput gain or a
reduction, the paper's "+13.1%"), it is within :data:`GAIN_POINTS` points of the paper (of the nearer end
of a range); for any other number when its relative error is within :data:`TOL`, or, for numbers near zero
where a relative error means nothing, within :data:`ABS_TOL`. The relative error is reported beside the
points for gains too. Where the paper contradicts itself, ``alt`` carries the other reading (label,
value); the verdict uses the stated reading and the report shows both.

Duplicates are not cells: a delta and its delta-% carry one number (the delta is kept); a delta whose
two ends are both predicted cells is arithmetic on them (dropped, :func:`dedupe`);
Table 2(a)'s DCPP column repeats Table 1; DCPP "Free" is DCPP's bubble less the fitted launch stall;
VPP "Free" is VPP's bubble.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

TOL = 0.10
GAIN_POINTS = 2.0
ABS_TOL = {"s": 0.01, "%": 0.1}
STATUSES = ("fitted", "derived", "structural", "predicted")


@dataclass(frozen=True)
class Cell:
    section: str
    row: str
    paper: object
    model: float | None
    unit: str = "s"
    note: str = ""
    gain: bool = False                 # a percentage gain: scored in points
    parts: tuple = ()                  # (a, b): a delta b - a of two other cells' keys
    structural: str = ""               # why the model value is built in (arithmetic, a zero by construction)
    alt: tuple | None = None           # the paper's other reading (label, value) where it contradicts itself
    status: str = "predicted"
    why: str = ""                      # what set the status (the fit sensitivity, the structure)

    @property
    def key(self) -> tuple[str, str]:
        return (self.section, self.row)

    def with_status(self, status: str, why: str = "") -> "Cell":
        if status not in STATUSES:
            raise ValueError(f"status={status!r}; expected one of {STATUSES}")
        return dataclasses.replace(self, status=status, why=why)

    def _distance(self, paper) -> float | None:
        """model - paper (or the nearer end of a range; 0 inside)."""
        if self.model is None or paper is None or isinstance(paper, str):
            return None
        if isinstance(paper, tuple):
            lo, hi = paper
            return 0.0 if lo <= self.model <= hi else self.model - (lo if self.model < lo else hi)
        return self.model - paper

    def _end(self, paper) -> float:
        if isinstance(paper, tuple):
            return paper[0] if self.model < paper[0] else paper[1]
        return paper

    @property
    def error(self) -> float | None:
        d = self._distance(self.paper)
        if d is None:
            return None
        end = self._end(self.paper)
        return d / abs(end) if end else None

    @property
    def points(self) -> float | None:
        """Distance in percentage points (gains only)."""
        return self._distance(self.paper) if self.gain else None

    def within_of(self, paper, tol: float = TOL) -> bool | None:
        d = self._distance(paper)
        if d is None:
            return None
        if self.gain:
            return abs(d) <= GAIN_POINTS + 1e-9
        end = self._end(paper)
        close = abs(d) <= ABS_TOL.get(self.unit, 0.0)
        return close or (bool(end) and abs(d / end) <= tol)

    @property
    def within(self) -> bool | None:
        return self.within_of(self.paper)

    @property
    def within_alt(self) -> bool | None:
        return None if self.alt is None else self.within_of(self.alt[1])

    def to_dict(self) -> dict:
        return {"section": self.section, "row": self.row, "paper": self.paper, "model": self.model,
                "unit": self.unit, "error": self.error, "points": self.points, "gain": self.gain,
                "status": self.status, "within": self.within, "why": self.why, "note": self.note,
                "alt": None if self.alt is None else {"reading": self.alt[0], "paper": self.alt[1],
                                                      "within": self.within_alt}}


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
    if unit == "tokens":
        return f"{v / 1024:.0f}K"
    if unit == "x":
        return f"{v:.2f}x"
    return f"{v:.2f}"


def markdown(cells: list[Cell]) -> str:
    """One table: section, quantity, paper, model, error (and points for gains), status, within, note."""
    lines = ["| table | quantity | paper | model | error | points | status | within | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        err = "-" if c.error is None else f"{100 * c.error:+.1f}%"
        pts = "-" if c.points is None else f"{c.points:+.1f}"
        ok = "-" if c.within is None else ("yes" if c.within else "**no**")
        note = c.note
        if c.alt is not None:
            note = (note + "; " if note else "") + (f"other reading ({c.alt[0]}): {_fmt(c.alt[1], c.unit)}, "
                                                    f"within: {'yes' if c.within_alt else 'no'}")
        if c.status != "predicted" and c.why:
            note = (note + "; " if note else "") + c.why
        lines.append(f"| {c.section} | {c.row} | {_fmt(c.paper, c.unit)} | {_fmt(c.model, c.unit)} | {err} | {pts} | "
                     f"{c.status} | {ok} | {note} |")
    return "\n".join(lines)


def summary(cells: list[Cell]) -> dict:
    """Counts per status, and for the predicted cells how many are within tolerance."""
    by = {s: [c for c in cells if c.status == s] for s in STATUSES}
    pred = [c for c in by["predicted"] if c.within is not None]
    good = [c for c in pred if c.within]
    return {"cells": len(cells), "counts": {s: len(v) for s, v in by.items()},
            "within": {s: sum(bool(c.within) for c in v) for s, v in by.items()},
            "predicted_scored": len(pred), "predicted_within": len(good),
            "predicted_share": len(good) / len(pred) if pred else 0.0,
            "missed": [f"{c.section}: {c.row}" for c in pred if not c.within]}


def required_step_cost(slow: float, fast: float, steps: int, target_gain: float) -> float:
    """Extra seconds per step that ``steps`` steps of the slower strategy would need so that the faster
    one gains ``target_gain`` in throughput: ((1 + gain) fast - slow) / steps."""
    return ((1.0 + target_gain) * fast - slow) / steps


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


# --- statuses: what each cell is, from what the fit touches ----------------------------------------
# The rule, applied to the model's own numbers rather than to a hand list. Each fitted constant is moved
# (the caller reruns the model with it moved, say by -10%) and every cell is recomputed:
#
# * a cell whose key is the fitted constant's target is ``fitted``;
# * a cell in the fitted cell's unit (seconds) that moves one for one with it (between :data:`FOLLOWS`
#   seconds per second) and whose relative change is at least :data:`SHARE` of the fitted cell's (the
#   fitted quantity is at least about half of it) is ``derived``: the fitted quantity plus or minus small
#   terms (VPP's computation, the Attention rows, the totals, DCPP's exposed communication). DCPP's bubble
#   holds the fitted launch stall (1.85 of 11.5 s): it moves one for one, but it is not a restatement. A
#   cell that moves *more* than the fitted cell (a bubble amplifying a compute change) or less, or a ratio or gain between two
#   strategies, holds a prediction of its own;
# * a cell declared structural (arithmetic of the chunking), or whose model value is exactly zero under
#   every setting of the constants, is ``structural``;
# * every other cell is ``predicted``.
#
# :func:`dedupe` then drops the deltas that carry no number of their own: a delta between two predicted
# cells is arithmetic on them; a delta with a fitted or derived end is where the prediction lives, and is
# kept (its derived ends stay in the table, unscored).

FOLLOWS = (0.8, 1.25)
SHARE = 0.5
ZERO = 1e-12


def sensitivity(cell: Cell, moved: Cell, fitted: Cell, fitted_moved: Cell) -> float | None:
    """Seconds ``cell`` moves per second the fitted cell moves; None for a cell in another unit."""
    if None in (cell.model, moved.model, fitted.model, fitted_moved.model) or not fitted.model:
        return None
    df = fitted_moved.model - fitted.model
    if df == 0:
        return None
    dc = moved.model - cell.model
    return dc / df if cell.unit == fitted.unit else None


def assign(base: list[Cell], moved: dict[str, tuple[tuple, list[Cell]]]) -> list[Cell]:
    """Statuses for ``base``; ``moved[constant] = (key of the cell it is fitted on, the cells recomputed
    with that constant moved)``."""
    fitted_keys = {key: name for name, (key, _) in moved.items()}
    index = {name: {c.key: c for c in cells} for name, (_, cells) in moved.items()}
    by_key = {c.key: c for c in base}
    for name, (key, _) in moved.items():
        if key not in by_key:
            raise ValueError(f"constant {name} is fitted on {key}, which is not a cell")
    out = []
    for c in base:
        if c.key in fitted_keys:
            out.append(c.with_status("fitted", f"{fitted_keys[c.key]} fitted on it"))
            continue
        follows = []
        for name, (key, _) in moved.items():
            m = index[name].get(c.key)
            s = None if m is None else sensitivity(c, m, by_key[key], index[name][key])
            share = None if s is None or not c.model else s * by_key[key].model / c.model
            if s is not None and FOLLOWS[0] <= s <= FOLLOWS[1] and share >= SHARE:
                follows.append(f"moves {s:.2f} per unit of the fitted '{key[1]}' ({name})")
        zero = c.model is not None and abs(c.model) < ZERO and all(
            index[n].get(c.key) is not None and abs(index[n][c.key].model or 0.0) < ZERO for n in moved)
        if c.structural:
            out.append(c.with_status("structural", c.structural))
        elif follows:
            out.append(c.with_status("derived", "; ".join(follows)))
        elif zero:
            out.append(c.with_status("structural", "zero by construction (no constant moves it)"))
        else:
            out.append(c.with_status("predicted"))
    return out


def dedupe(cells: list[Cell]) -> tuple[list[Cell], list[str]]:
    """Drop deltas both of whose ends are predicted cells; returns (kept cells, what was dropped and why)."""
    status = {c.key: c.status for c in cells}
    kept, dropped = [], []
    for c in cells:
        if c.parts and all(status.get(p) == "predicted" for p in c.parts):
            dropped.append(f"{c.section}: {c.row} (= {c.parts[1][1]} - {c.parts[0][1]}, both scored)")
        else:
            kept.append(c)
    return kept, dropped
