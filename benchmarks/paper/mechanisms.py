"""The mechanisms of the paper-scale model, each with its source and the constant it carries (section 2 of
the paper reproduction), and for every missed cell the mechanism that would have to differ (section 3b).

A miss is matched to a mechanism by its section and the start of its row (first match wins); the gap is
computed from the cell (the paper's value, or the nearer end of its range, less the model's), so the
amounts cannot drift from the table."""

from __future__ import annotations

MECHANISMS = (
    ("attention FLOPs", "causal pairs x heads x head dims per chunk; time at eff_attn of peak", "model configs",
     "eff_attn FITTED (CPP computation)"),
    ("MLA prefix rebuild per chunk", "gather, up-projection GEMM and split/concat copies of the cached prefix for "
     "every chunk (vLLM's MLA chunked-context prefill)", "vLLM MLA code; Table 2(b) Slice / MatMulV3", "none"),
    ("TP collectives", "2 all-reduces per layer (ring: 2(n-1) latency steps + volume at eff_link); the paper's "
     "AllGather facts (Sec. 6.3) are read on them: its +5.27 s is the size of these, not of the PP hand-overs' "
     "all-gathers (benchmarks/paper/claims.py allgather_cells)",
     "HCCL ring algorithm", "eff_link FITTED (CPP exposed comm.); link_latency 10 us assumed"),
    ("fixed cost per collective", "an extra cost per collective call", "none found; section 3b sizes what Table "
     "1's +6.01 s asks for", "off"),
    ("PP hand-over", "1/tp slice p2p + all-gather in the receiving TP group, with its ring latency",
     "vLLM send_tensor_dict(all_gather_group=tp)", "none"),
    ("kernel launches", "10 us per kernel on the device timeline", "assumed (torch_npu eager)", "none"),
    ("stage-time imbalance", "what differs between ranks: vLLM's 31/30 split, 3 dense layers and the embedding on "
     "rank 0, final norm / LM head / last-token sampling on the last rank", "vLLM get_pp_indices; model configs",
     "none (section 5: +3.3%)"),
    ("launch stall", "host work before each step's first kernel, device idle where the runner syncs the device "
     "before a step: DCPP's online timing (need_timing, default on), on the steps the planner times "
     "(Setup.dcpp_sync)", "vllm-ascend model_runner_v1: `if need_timing: self._sync_device()`; "
     "Table 2(c)", "host_step FITTED (DCPP launch stall)"),
    ("DCPP online calibration", "vLLM-Ascend's default need_timing=True: the planner re-fits "
     "f(C,H) = aC(C+H) + b(C+H) + c over the first 30 steps", "vllm-ascend profiling_chunk_predictor.py, "
     "docs (need_timing default True, max_fit_chunk 30)", "none"),
    ("per-chunk unhidden cost", "a cost per chunk no schedule hides", "none found", "off (section 5 sizes it)"),
    ("profiler accounting", "a communication task runs from its issue to its data's arrival: async plans' "
     "posted receives are communication (overlapped while the rank computes), posted no earlier than their "
     "step's dispatch (a rank waiting for a request not yet scheduled is Free); blocking hand-overs wait as Free",
     "Ascend profiler step trace; vLLM's CPU-side metadata exchange; vLLM's model runner receives inside the "
     "step it was given", "none; both views and the early post in section 4"),
    ("shared token budget in streams", "each step carries up to the budget: the rest of the running request, then "
     "the first chunks of the next ones; DCPP's time budget shared the same way (vpp/schedules/shared_budget.py, "
     "issue 20)", "vLLM scheduler (running, then waiting requests while the token budget lasts); vLLM-Ascend "
     "#9900 (shared time budget)", "none; on in the streams (Setup.shared_budget), section 7 scores the streams "
     "with it off"),
    ("batched steps in streams", "a shared step is one forward: GEMMs, MoE, norms and TP collectives once on the "
     "step's tokens (weights read once, one launch, one all-reduce per collective), attention per piece over its "
     "own prefix, launches and per-step costs once; each piece's COMPUTE gets its own attention plus a token share "
     "of the rest (vpp/perf/batched.py)", "vLLM / vLLM-Ascend model runner (one forward per scheduled batch, "
     "variable-length attention)", "none; on in the streams (Setup.batched_steps), section 7 scores the streams "
     "with one stage call per piece"),
)

WAITING = ("waiting per rank: a stage-time imbalance of ~10% of compute (vLLM's 31/30 split, dense layers and "
           "embedding / head give 3.3%, section 5)")
PLANNER = ("DCPP's planner: vLLM-Ascend main's planner fed the peer's profile (output rank, online calibration) "
           "cuts 22 steps at 128K / 16K and 106 at 512K / 24K; no sourced variant (first rank, whole-pipeline "
           "timing, page 128, min chunk 2048, offline) goes below 19 (section 5); the paper's 17 needs a mean "
           "chunk of ~7.7K, ours is ~6.0K; each extra step adds MLA prefix rebuild and collectives")
STALL = ("DCPP's per-step cost: where and how often vLLM-Ascend synchronises; at 64K-256K the paper's DCPP cannot "
         "have paid the fitted stall on every step")
COLLECTIVE = ("a fixed cost per collective call of {per_call:.2f} ms (what closes Table 1's +6.01 s over DCPP's extra "
              "calls; the model's calls pay their ring latency, 10 us a step)")
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


def mechanism(cell, per_call: float) -> str:
    """The mechanism that would have to differ for a missed cell (first rule matching its section and row)."""
    for section, prefix, why in RULES:
        if cell.section.startswith(section) and cell.row.startswith(prefix):
            return why.format(per_call=1e3 * per_call)
    return "not analysed"


def gap(cell) -> str:
    """What the model would have to add to reach the paper (or the nearer end of its range)."""
    d = cell._distance(cell.paper)
    if d is None:
        return "-"
    if cell.unit == "tokens":
        return f"{-d / 1024:+.0f}K tokens"
    return f"{-d:+.2f}" + {"s": " s", "%": " points", "x": "x", "steps": " steps", "cells": " cells"}.get(cell.unit, "")


__all__ = ["MECHANISMS", "RULES", "gap", "mechanism"]
