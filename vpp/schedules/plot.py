"""A PNG timeline like the paper's Figure 2: one row per rank, compute boxes labelled stage/chunk, bubbles
hatched grey, exposed communication in black, waiting for work (no request in the system) white. Needs matplotlib (the "plot" extra), imported lazily."""

from __future__ import annotations

import os

from vpp.safe_write import atomic_open

from .summary import timeline

COMM_COLOR, BUBBLE_COLOR = "#222222", "#d9d9d9"
SOURCES = {"simulated": "simulated", "executed": "measured"}  # a trace's meta "source" -> the title's word


def default_title(trace: "Trace") -> str:
    """The plan's name and where the trace comes from: ``"vpp-async (measured)"``, ``"cpp (simulated)"``."""
    plan, source = str(trace.meta.get("plan", "")), SOURCES.get(trace.meta.get("source"))
    return f"{plan} ({source})" if source else plan


def plot_trace(trace: "Trace", path, *, title: str | None = None, unit: str = "s", width: float = 12.0) -> None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
        import matplotlib
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("Trace.plot needs matplotlib: pip install matplotlib (or -e '.[plot]' in a clone)") from e
    rows = timeline(trace)
    t0, span = trace.start, max(trace.makespan, 1e-12)
    chunks = sorted({(s.request or 0, s.chunk or 0) for s in trace.spans if s.kind == "compute"})
    colour = {qc: matplotlib.colormaps["tab20"](i % 20) for i, qc in enumerate(chunks)}
    many = len({q for q, _ in chunks}) > 1
    fig = Figure(figsize=(width, 0.9 + 0.6 * trace.num_ranks))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for r, segs in enumerate(rows):
        y = trace.num_ranks - 1 - r
        for kind, a, b, s in segs:
            x, w = a - t0, b - a
            if kind == "compute":
                ax.barh(y, w, left=x, height=0.8, color=colour[(s.request or 0, s.chunk or 0)], edgecolor="black",
                        linewidth=0.5)
                if w > span / 60:
                    text = f"s{s.stage}/C{s.chunk}" + (f"/R{s.request}" if many else "")
                    ax.text(x + w / 2, y, text, ha="center", va="center", fontsize=7, clip_on=True)
            elif kind == "comm":
                ax.barh(y, w, left=x, height=0.8, color=COMM_COLOR, edgecolor="none")
            elif kind == "wait":
                ax.barh(y, w, left=x, height=0.8, color="white", edgecolor="#bbbbbb", linewidth=0.5)
            else:
                ax.barh(y, w, left=x, height=0.8, color=BUBBLE_COLOR, hatch="//", edgecolor="grey", linewidth=0)
    ax.set_yticks(range(trace.num_ranks), [f"pp{r}" for r in reversed(range(trace.num_ranks))])
    ax.set_xlim(0, span)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title or default_title(trace), loc="left")
    ax.legend(handles=[Patch(facecolor="white", edgecolor="black", label="compute (stage/chunk)"),
                       Patch(facecolor=COMM_COLOR, label="exposed comm"),
                       Patch(facecolor=BUBBLE_COLOR, hatch="//", edgecolor="grey", label="bubble")],
              loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:  # a new or regular file, replaced whole
        fig.savefig(f, dpi=120, format=os.path.splitext(os.fspath(path))[1].lstrip(".") or "png")


__all__ = ["SOURCES", "default_title", "plot_trace"]
