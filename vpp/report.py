"""The pieces of a results file: a markdown table, a size in K, a PNG figure written whole.

What the benchmarks and the commands that print tables share; pure Python (matplotlib imported only when
a figure is made), so every room of vpp and every script reaches it."""

from __future__ import annotations

import os

from .safe_write import atomic_open


def md_table(header, rows) -> str:
    """A GitHub markdown table; floats get 2 decimals, None shows as a dash."""
    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.2f}"
        return str(v)
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def kib(n: int) -> str:
    """A token count in K where it is a whole number of 1024s (24576 -> "24K")."""
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def figure(width=8.0, height=4.5):
    """A matplotlib figure without pyplot (no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def save(fig, out_dir: str, name: str) -> str:
    """Writes ``fig`` as ``out_dir/name`` (the format from the suffix) through :func:`vpp.safe_write.atomic_open`."""
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:  # a new or regular file, replaced whole
        fig.savefig(f, dpi=110, format=os.path.splitext(name)[1].lstrip(".") or "png")
    return path


__all__ = ["figure", "kib", "md_table", "save"]
