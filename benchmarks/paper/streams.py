"""The request streams of the paper's Fig. 3 at paper scale, for :mod:`.paper_repro` (its section 7):
each strategy at its best budget under vLLM's shared token budget, each shared step one forward
(vpp/perf/batched.py), and the switches that turn each of those off.
"""

from __future__ import annotations

from vpp.perf.runs import MODELS
from vpp.report import kib, md_table
from vpp.schedules import strategies
from vpp.schedules.workloads import long as long_stream, mixed, short

from . import cells as C, claims as PC, published as paper
from .jobs import pmap
from .serving import best_budget, compare

LABEL = {s: strategies.get(s).label for s in strategies.PLANNED}


def streams(setups, quick: bool, shared_budget: bool = True, batched: bool = True, *, jobs: int = 1) -> dict:
    """The Fig. 3 streams, each strategy at its best budget; ``shared_budget``: vLLM's shared token budget
    (:mod:`vpp.schedules.shared_budget`), ``batched``: each shared step one forward (:mod:`vpp.perf.batched`),
    both the adopted model. Each (model, stream) a piece of its own on up to ``jobs`` processes."""
    setups = {m: st.replace(shared_budget=shared_budget, batched_steps=batched) for m, st in setups.items()}
    workloads = {"mixed": mixed(scale=1)}
    for n in (4096, 8192, 16384):
        workloads[f"short-{n // 1024}K"] = short(scale=1, length=n)
    if not quick:
        workloads["long"] = long_stream(scale=1, lengths=paper.LENGTHS[:4])
    keys = [(m, w) for m in MODELS for w in workloads]
    return dict(zip(keys, pmap(_stream_rows, [(setups[m], workloads[w]) for m, w in keys], jobs)))


def _stream_rows(piece) -> dict:
    setup, workload = piece
    rows = compare(setup, workload)
    rows["vpp-packed/rank"] = best_budget(setup, workload, "vpp-packed", per_rank=True)
    return rows


def section_stream_switches(results, off, calls, eq2) -> str:
    """The Fig. 3 cells as adopted (shared token budget, each shared step one forward, packing estimated on
    the deployment's cost model), with one prompt per step, with one stage call per piece of a shared
    step, and with packing estimated on Algorithm 2's own law."""
    if off is None or calls is None or eq2 is None:
        return "(stream switches: full run only)"
    cols = [PC.stream_cells(r) for r in (results, off, calls, eq2)]
    body = [[c.section, c.row, C._fmt(c.paper, c.unit)]
            + [x for o in row for x in (C._fmt(o.model, o.unit), "yes" if o.within else "no")]
            for row in zip(*cols) for c in [row[0]]]
    n = [sum(bool(c.within) for c in col) for col in cols]

    def moved(other, fig):
        d = [x.model - y.model for x, y in zip(cols[0], other) if x.section == fig and None not in (x.model, y.model)]
        return f"{min(d):+.1f} to {max(d):+.1f}"
    return "\n".join([
        f"**Three switches on the streams**: within {n[0]} of {len(cols[0])} as adopted (vLLM's shared token "
        f"budget, each shared step one forward, packing estimated on the deployment's cost model), {n[1]} with one "
        f"prompt per step, {n[2]} with each request's piece of a shared step its own stage call (the model before "
        f"batched steps), {n[3]} with packing estimated on Algorithm 2's own law (tau_k = (k + 1) t, the paper's "
        "Sec. 5). A batched step runs the GEMMs, MoE, norms and TP collectives once on the step's tokens and "
        "only attention per piece, over its own prefix (vpp/perf/batched.py), so the prompts of one step share "
        "its weight reads, launches and collectives; against one stage call per piece the adopted cells differ "
        f"by {moved(cols[2], 'Fig. 3 mixed')} points on the mixed stream and {moved(cols[2], 'Fig. 3 short')} on "
        "the short ones. Under shared steps a stream is scheduled as one sequence of steps (vpp/schedules/steps.py), "
        "which leaves no drain between requests to pack: VPP + packing runs as VPP-Async there, and the packing "
        f"estimate moves the cells by {moved(cols[3], 'Fig. 3 mixed')} (mixed) and "
        f"{moved(cols[3], 'Fig. 3 short')} (short) points.", "",
        md_table(["figure", "quantity", "paper", "adopted", "within", "one prompt per step", "within",
                  "one call per piece", "within", "packing on Eq. 2", "within"], body), ""])


def section_streams(results, off=None, calls=None, eq2=None) -> str:
    lines = ["## 7. Request streams at paper scale (Fig. 3 workloads)", "",
             "Each strategy at its best budget (highest throughput); TTFT from hand-over (median / p90, s); "
             "throughput in tokens/s. VPP = VPP-Async + packing (the paper's full method, scored in section 3); "
             "'per-rank V' is the same on a V balanced per rank (rank 0 carries the embedding and the head). "
             "Every strategy fills its steps under vLLM's shared token budget (vpp/schedules/shared_budget.py; DCPP "
             "with vLLM-Ascend's shared time budget and its online calibration over the first steps, each timed "
             "step one forward) and runs each shared step as one forward (vpp/perf/batched.py); the plan keeps "
             "one COMPUTE per piece, whose times sum to the step's.", "",
             section_stream_switches(results, off, calls, eq2), ""]
    label = lambda s: "VPP-Async + packing, per-rank V" if s == "vpp-packed/rank" else LABEL[s]
    for (model, wl), rows in results.items():
        body = [[label(s), kib(r.chunk), r.chunks, r.stats.ttft_median, r.stats.ttft_p90, f"{r.stats.throughput:.0f}",
                 f"{100 * (r.stats.throughput / rows['cpp'].stats.throughput - 1):+.1f}%",
                 f"{100 * (r.stats.throughput / rows['dcpp'].stats.throughput - 1):+.1f}%"] for s, r in rows.items()]
        lines += [f"{model}, {wl}:", "", md_table(["strategy", "budget", "chunks", "TTFT median", "TTFT p90",
                                                   "throughput", "vs CPP", "vs DCPP"], body), ""]
    return "\n".join(lines)


__all__ = ["section_stream_switches", "section_streams", "streams"]
