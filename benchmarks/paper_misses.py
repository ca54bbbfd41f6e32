"""Every missed cell with the gap to close and the mechanism that would have to differ.

A miss is matched to a mechanism by its section and the start of its row (first match wins); the gap is
computed from the cell (the paper's value, or the nearer end of its range, less the model's), so the
amounts cannot drift from the table. The mechanisms are the ones of the what-if table
(:mod:`benchmarks.paper_whatif`) and of section 5 of the report, where their sizes are worked out.
"""

from __future__ import annotations

from benchmarks._report import md_table

from .cells import Cell, _fmt

WAITING = ("waiting per rank: a stage-time imbalance of ~10% of compute (the 'rank 0 one layer heavier' what-if "
           "closes CPP / DCPP bubble and VPP's communication; vLLM's 31/30 split, dense layers and embedding / head "
           "give 3.3%)")
PLANNER = ("DCPP's planner: vLLM-Ascend main's planner fed the peer's profile (output rank, online calibration) "
           "cuts 22 steps at 128K / 16K and 106 at 512K / 24K; no sourced variant (first rank, whole-pipeline "
           "timing, page 128, min chunk 2048, offline) goes below 19 (section 5); the paper's 17 needs a mean "
           "chunk of ~7.7K, ours is ~6.0K; each extra step adds MLA prefix rebuild and collectives")
STALL = ("DCPP's per-step cost: where and how often vLLM-Ascend synchronises (what-if rows: every step, first 30 "
         "steps, none); at 64K-256K the paper's DCPP cannot have paid the fitted stall on every step")
COLLECTIVE = ("a fixed cost per collective call (~0.9 ms per call closes Table 1's +6.01 s; the model's calls pay "
              "their ring latency, 10 us a step)")
OVERLAP = ("how long VPP-Async's posted receives are in flight: the model posts each receive a whole compute slot "
           "ahead (no earlier than its step's dispatch, which moves only the waiting between requests); the paper's "
           "overlap implies about a third less")
GQA = ("a DCPP cost growing with prefix x steps on GQA (Qwen); no per-step constant fits both 128K and 512K "
       "(section 5)")
CHUNK = ("a per-chunk cost that no schedule hides (section 5 gives the window per cell that would make 24K best)")
STREAM = ("the streams: vLLM's shared token budget and one forward per shared step are modelled (section 7 scores "
          "each switched off); under shared steps a stream runs as one sequence of steps, so VPP + packing is "
          "VPP-Async there and the paper's packing has no counterpart in the model")
ATTN = "attention efficiency by chunk size: VPP's 24K calls would have to run ~2% slower than DCPP's ~4.6K calls"
PACKING = ("the packer's gain and the dispatch rule: receives are posted no earlier than their step's dispatch, so "
           "VPP-Async's wait for the next request is Free and packing, which starts the next request during the "
           "drain, removes two thirds of that bubble; the paper's removes a third (its packer fills less of the "
           "drain, or its engine dispatches the next request earlier than the end of the previous one)")
CONTRA = "the paper's own readings disagree (both shown); the model sides with neither"
ALLGATHER = ("VPP-Async's TP collectives running slower per byte than DCPP's, by the paper's per-call ratio over "
             "the model's (the model's is the steps' token ratio alone, see the note): contention with the PP "
             "transfers overlapped beside them, or TP-rank skew waited out inside the collective; neither is "
             "modelled")

RULES = (
    ("Table 1", "CPP bubble", WAITING), ("Table 1", "DCPP bubble", WAITING), ("Table 1", "delta bubble", WAITING),
    ("Table 2(a)", "VPP bubble", WAITING), ("Table 2(a)", "delta bubble", WAITING),
    ("Table 1", "delta exposed", COLLECTIVE), ("Table 2(a)", "delta exposed", OVERLAP + "; " + WAITING),
    ("Table 1", "delta computation", PLANNER), ("Table 2(a)", "delta computation", PLANNER),
    ("Table 1", "DCPP over CPP", PLANNER + "; " + STALL), ("Table 2(a)", "VPP over DCPP", PLANNER + "; " + WAITING),
    ("Table 2(b)", "DCPP MatMulV3", PLANNER), ("Table 2(b)", "VPP Slice", "MLA prefix copies per VPP chunk"),
    ("Table 2(b)", "delta Attention", ATTN), ("Table 2 text", "VPP overlap", OVERLAP),
    ("Table 2 text", "AllGather calls", PLANNER),
    ("Table 2 text", "AllGather latency", ALLGATHER), ("Table 2 text", "AllGather overhead", ALLGATHER + "; " + CONTRA),
    ("Fig. 1(b)", "DCPP steps", PLANNER), ("Sec. 4", "DCPP / CPP steps", PLANNER), ("Sec. 4", "DCPP's best", PLANNER),
    ("Sweep", "deepseek-v3.1: DCPP over CPP", STALL), ("Sweep", "deepseek-v3.1: VPP over DCPP", STALL),
    ("Sweep", "qwen3-coder-30b-a3b: VPP over DCPP", GQA), ("Sweep", "glm-5.2", STALL), ("Sweep", "", CHUNK),
    ("Chunk sensitivity", "", CHUNK), ("Ablation", "packing", PACKING), ("Ablation", "compute spread", ATTN),
    ("Ablation", "", OVERLAP), ("Fig. 3", "", STREAM),
)


def mechanism(cell: Cell) -> str:
    for section, prefix, why in RULES:
        if cell.section.startswith(section) and cell.row.startswith(prefix):
            return why
    return "not analysed"


def gap(cell: Cell) -> str:
    """What the model would have to add to reach the paper (or the nearer end of its range)."""
    d = cell._distance(cell.paper)
    if d is None:
        return "-"
    unit = {"s": " s", "%": " points", "x": "x", "steps": " steps", "cells": " cells", "tokens": " tokens"}.get(cell.unit, "")
    return f"{-d:+.2f}{unit}" if cell.unit not in ("tokens",) else f"{-d / 1024:+.0f}K tokens"


def section(cells: list[Cell]) -> str:
    misses = [c for c in cells if c.within is False and c.status in ("predicted", "structural")]
    body = [[c.section, c.row, c.status, _fmt(c.paper, c.unit), _fmt(c.model, c.unit), gap(c), mechanism(c)]
            for c in misses]
    return "\n".join(["## 3b. Every miss, the gap and the mechanism that would have to differ", "",
                      md_table(["table", "quantity", "status", "paper", "model", "gap (model needs)", "mechanism"], body),
                      ""])
