"""Small helpers for the markdown and PNG outputs of the benchmarks."""

from __future__ import annotations

import os


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


def pct(a: float, b: float) -> str:
    """(a - b) / b as a signed percentage."""
    return f"{100.0 * (a - b) / b:+.1f}%" if b else "-"


def kib(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def figure(width=8.0, height=4.5):
    """A matplotlib figure without pyplot (no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def save(fig, out_dir: str, name: str) -> str:
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    from vpp.safe_write import atomic_open
    with atomic_open(path, "wb") as f:  # a new or regular file, replaced whole
        fig.savefig(f, dpi=110, format=os.path.splitext(name)[1].lstrip(".") or "png")
    return path
