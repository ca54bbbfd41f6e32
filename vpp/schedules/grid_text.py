"""Printing a plan as a rank x step grid, with cells marked (used by the verifier's errors).

``format_grid`` reads only ``plan.actions``, ``plan.num_steps``, ``plan.num_ranks``, ``plan.name`` and
``plan.comm``, so it needs no import of :mod:`.ir` (which imports this module)."""

from __future__ import annotations

WINDOW = 6  # steps shown either side of a marked cell when no explicit range is given


def _marks(mark) -> set[tuple[int, int]]:
    if mark is None:
        return set()
    if len(mark) == 2 and all(isinstance(x, int) for x in mark):
        return {(int(mark[0]), int(mark[1]))}
    return {(int(r), int(s)) for r, s in mark}


def format_grid(plan, mark=None, *, start: int | None = None, stop: int | None = None) -> str:
    marks = _marks(mark)
    steps = plan.num_steps
    if start is None and stop is None and marks:
        start = max(0, min(s for _, s in marks) - WINDOW)
        stop = min(max(steps, 1), max(s for _, s in marks) + WINDOW + 1)
    start = 0 if start is None else max(0, start)
    stop = steps if stop is None else min(max(stop, start), max(steps, max((s + 1 for _, s in marks), default=0)))
    cols = range(start, stop)
    cells = [[str(acts[i]) if i < len(acts) else "." for i in cols] for acts in plan.actions]
    width = max([len(c) for row in cells for c in row] + [len(str(stop))]) + 2
    label = max(len(f"rank {plan.num_ranks - 1}"), 4)
    head = (f"plan {plan.name!r} ({plan.comm}), {plan.num_ranks} ranks, {steps} steps"
            + (f"; steps {start}..{stop - 1} shown" if (start, stop) != (0, steps) else ""))
    lines = [head, "step".ljust(label) + " |" + "".join(str(i).center(width) for i in cols)]
    for rank, row in enumerate(cells):
        text = "".join((f"[{c}]" if (rank, i) in marks else f" {c} ").center(width) for i, c in zip(cols, row))
        right = " ..." if stop < len(plan.actions[rank]) else ""
        lines.append(f"rank {rank}".ljust(label) + " |" + text + right)
        if any((rank, i) in marks for i in cols):
            under = "".join(("^" * (len(c) + 2) if (rank, i) in marks else "").center(width) for i, c in zip(cols, row))
            lines.append(" " * label + "  " + under.rstrip())
    return "\n".join(lines)


__all__ = ["WINDOW", "format_grid"]
