"""What each cell is, from what the fit touches: fitted, derived, structural or predicted.

The rule, applied to the model's own numbers rather than to a hand list. Each fitted constant is moved
(the caller reruns the model with it moved, say by -10%) and every cell is recomputed:

* a cell whose key is the fitted constant's target is ``fitted``;
* a cell in the fitted cell's unit (seconds) that moves one for one with it (between :data:`FOLLOWS`
  seconds per second) and whose relative change is at least :data:`SHARE` of the fitted cell's (the
  fitted quantity is at least about half of it) is ``derived``: the fitted quantity plus or minus small
  terms (VPP's computation, the Attention rows, the totals, DCPP's exposed communication). DCPP's bubble
  holds the fitted launch stall (1.85 of 11.5 s): it moves one for one, but it is not a restatement. A
  cell that moves *more*
  than the fitted cell (a bubble amplifying a compute change) or less, or a ratio or gain between two
  strategies, holds a prediction of its own;
* a cell declared structural (arithmetic of the chunking), or whose model value is exactly zero under
  every setting of the constants, is ``structural``;
* every other cell is ``predicted``.

:func:`dedupe` then drops the deltas that carry no number of their own: a delta between two predicted
cells is arithmetic on them; a delta with a fitted or derived end is where the prediction lives, and is
kept (its derived ends stay in the table, unscored).
"""

from __future__ import annotations

from .cells import Cell

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
