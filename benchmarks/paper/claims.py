"""Every number the paper reports, as cells (:mod:`.cells`) built from simulated rows.

The builders take rows (:class:`vpp.perf.decompose.Row`, profiler view) and sweep points
(:mod:`.sweep`). Each published number appears once: a delta is kept and its delta-% folded
into the note; Table 2(a)'s DCPP column (= Table 1), DCPP "Free" (= bubble less the fitted launch stall)
and VPP "Free" (= VPP's bubble) are not cells. Which deltas are scored is decided after the statuses are
known (:func:`.cells.dedupe`).
"""

from __future__ import annotations

from vpp.schedules import strategies

from . import published as paper
from .cells import Cell
from .sweep import Point, best

PARTS = (("computation", "compute"), ("bubble", "bubble"), ("exposed comm.", "exposed_comm"), ("total", "total"))


def _tput(slow: float, fast: float) -> float:
    """Throughput gain (%) of the faster of two single-request runs: TTFT ratio - 1."""
    return 100.0 * (slow / fast - 1.0)


def pp_comm(row) -> float:
    """Per-rank PP communication time (all of it, overlapped or not): the row's communication less the
    stage's TP / CP collectives."""
    return row.comm_total - row.categories.get("tp_comm", 0.0) - row.categories.get("cp_comm", 0.0)


def table_cells(rows: dict) -> list[Cell]:
    """Tables 1, 2(a)-(c) and the overlap ratios of the 512K / 24K DeepSeek run; ``rows`` maps "cpp",
    "dcpp", "vpp-async" to rows (the paper's VPP is VPP-Async: its 51.75% overlap says so)."""
    P, cells = paper.TABLE_512K, []
    c, d, v = rows["cpp"], rows["dcpp"], rows["vpp-async"]
    for label, key in PARTS:
        cells += [Cell("Table 1", f"CPP {label}", P["cpp"][key], getattr(c, key)),
                  Cell("Table 1", f"DCPP {label}", P["dcpp"][key], getattr(d, key))]
    for label, key in PARTS[:3]:
        pc, pd = P["cpp"][key], P["dcpp"][key]
        cells.append(Cell("Table 1", f"delta {label}", pd - pc, getattr(d, key) - getattr(c, key),
                          note=f"paper {100 * (pd - pc) / pc:+.2f}%",
                          parts=(("Table 1", f"CPP {label}"), ("Table 1", f"DCPP {label}"))))
    cells.append(Cell("Table 1", "DCPP over CPP throughput (delta total)", _tput(P["cpp"]["total"], P["dcpp"]["total"]),
                      _tput(c.total, d.total), "%", "paper: -4.4% throughput / +4.65% TTFT (also Sec. 6.2, 512K)",
                      gain=True))
    for label, key in PARTS[:3]:
        pd, pv = P["dcpp"][key], P["vpp"][key]
        cells.append(Cell("Table 2(a)", f"VPP {label}", pv, getattr(v, key), note="model: VPP-Async"))
        cells.append(Cell("Table 2(a)", f"delta {label}", pv - pd, getattr(v, key) - getattr(d, key),
                          note=f"paper {100 * (pv - pd) / pd:+.2f}%",
                          parts=(("Table 1", f"DCPP {label}"), ("Table 2(a)", f"VPP {label}"))))
    cells.append(Cell("Table 2(a)", "VPP over DCPP throughput, 512K", 100 * paper.VPP_OVER_DCPP_512K,
                      _tput(d.total, v.total), "%", "stated in Sec. 6.2 / abstract", gain=True,
                      alt=("Table 2(a): -40.36 s = -12.53% TTFT", _tput(P["dcpp"]["total"], P["vpp"]["total"]))))
    D = paper.COMPUTE_DETAIL_512K
    for kernel, cat, note in (("Attention", "attention", "attention kernels and merges"),
                              ("Slice", "prefix_mem", "model: MLA prefix gather + split/concat copies"),
                              ("MatMulV3", "prefix_gemm", "model: MLA prefix up-projection GEMM")):
        pd, pv = D["dcpp"][kernel], D["vpp"][kernel]
        md, mv = d.categories.get(cat, 0.0), v.categories.get(cat, 0.0)
        cells += [Cell("Table 2(b)", f"DCPP {kernel}", pd, md, note=note), Cell("Table 2(b)", f"VPP {kernel}", pv, mv),
                  Cell("Table 2(b)", f"delta {kernel}", pv - pd, mv - md, note=f"paper {100 * (pv - pd) / pd:+.1f}%",
                       parts=(("Table 2(b)", f"DCPP {kernel}"), ("Table 2(b)", f"VPP {kernel}")))]
    B, O = paper.BUBBLE_DETAIL_512K, paper.OVERLAP_RATIO_512K
    cells += [Cell("Table 2(c)", "DCPP Launch stall", B["dcpp"]["Launch stall"], d.launch_stall),
              Cell("Table 2(c)", "VPP Launch stall", B["vpp"]["Launch stall"], v.launch_stall),
              Cell("Table 2 text", "DCPP overlap ratio", 100 * O["dcpp"], 100 * d.overlap_ratio, "%"),
              Cell("Table 2 text", "VPP overlap ratio", 100 * O["vpp"], 100 * v.overlap_ratio, "%")]
    return cells


def receives_per_chunk(layout) -> list[int]:
    """PP hand-overs each rank receives per chunk (each is a receive plus an all-gather in the receiving TP
    group): one for every stage whose predecessor sits on another rank."""
    out = [0] * (max(layout.rank_of(s) for s in range(layout.num_stages)) + 1)
    for s in range(1, layout.num_stages):
        if layout.rank_of(s) != layout.rank_of(s - 1):
            out[layout.rank_of(s)] += 1
    return out


def allgather_cells(d, v, d_layout, v_layout) -> list[Cell]:
    """Sec. 6.3's AllGather facts from the 512K DCPP and VPP-Async rows, read as the per-layer TP
    collectives (the model's all-reduces; a ring all-reduce is a reduce-scatter and an all-gather).

    Why that reading: the paper's +5.27 s = +39.7% puts DCPP's AllGather time at ~13.3 s and VPP's at
    ~18.5 s per rank, the size of the model's TP collectives (~17 s), while the PP hand-overs' all-gathers
    (one per received chunk, vLLM's ``send_tensor_dict(all_gather_group=tp)``) move ~0.3 s in DCPP; the
    paper does not say which all-gathers it counts. Per rank, calls scale with the steps (the same layers
    on each rank in both layouts), time per call with each step's tokens. The note gives the PP
    hand-over reading's figures beside it. The paper's 4.58x fewer calls at 11x the latency each is
    +140%, not its stated +39.7%."""
    A = paper.ALLGATHER_512K
    tp_d, tp_v = d.categories.get("tp_comm", 0.0), v.categories.get("tp_comm", 0.0)
    calls = d.chunks / v.chunks
    rd, rv = receives_per_chunk(d_layout), receives_per_chunk(v_layout)
    mean_d, mean_v = d.chunks * sum(rd) / len(rd), v.chunks * sum(rv) / len(rv)
    pp_lat = (pp_comm(v) / mean_v) / (pp_comm(d) / mean_d)
    both = [r for r in range(min(len(rd), len(rv))) if rd[r] and rv[r]]
    return [Cell("Table 2 text", "AllGather calls DCPP / VPP", A["calls_dcpp_over_vpp"], calls, "x",
                 f"model: TP collectives per rank, one set per step (PP hand-overs received: "
                 f"{d.chunks * rd[both[0]] / (v.chunks * rv[both[0]]):.2f}x on rank {both[0]}, "
                 f"{mean_d / mean_v:.2f}x averaged over ranks)"),
            Cell("Table 2 text", "AllGather latency per call VPP / DCPP", A["latency_vpp_over_dcpp"],
                 (tp_v / v.chunks) / (tp_d / d.chunks), "x",
                 f"model: TP collective time per call, per rank (PP hand-overs, from post to arrival: {pp_lat:.0f}x)"),
            Cell("Table 2 text", "AllGather overhead VPP over DCPP", 100 * A["overhead_increase"],
                 100 * (tp_v / tp_d - 1), "%",
                 f"stated: +5.27 s; model: {tp_v - tp_d:+.2f} s on {tp_d:.1f} s (PP hand-overs: "
                 f"{pp_comm(d):.2f} s -> {pp_comm(v):.1f} s)",
                 alt=("4.58x fewer calls x 11x latency", 100 * (A["latency_vpp_over_dcpp"] / A["calls_dcpp_over_vpp"] - 1)))]


def steps_cells(cpp_128k: int, dcpp_128k: int, cpp_512k: int, dcpp_512k: int) -> list[Cell]:
    """Fig. 1(b) and the step ratio of Sec. 4."""
    return [Cell("Fig. 1(b)", "CPP steps, 128K (16K budget)", paper.STEPS["cpp_128k"], cpp_128k, "steps",
                 structural="128K / 16K: fixed chunking"),
            Cell("Fig. 1(b)", "DCPP steps, 128K (16K budget)", paper.STEPS["dcpp_128k"], dcpp_128k, "steps"),
            Cell("Sec. 4", "DCPP / CPP steps, 512K (24K budget)", paper.STEPS["dcpp_over_cpp_512k"],
                 dcpp_512k / cpp_512k, "x")]


def motivation_cells(cpp_128k_row, dcpp_best_512k: int | None) -> list[Cell]:
    """Sec. 1-2: CPP's bubble at 128K ("15%+ of prefill time", Fig. 1), DCPP's best budget at 512K (24K)."""
    return [Cell("Sec. 2", "CPP bubble share, 128K (16K budget)", (15.0, 100.0), 100 * cpp_128k_row.bubble_ratio, "%",
                 "paper: 'up to 15%+'"),
            Cell("Sec. 4", "DCPP's best budget, 512K", 24576, dcpp_best_512k, "tokens",
                 structural="" if dcpp_best_512k is not None else "not swept")]


def throughput_gain(points: list[Point], model: str, of: str, over: str, length: int) -> float | None:
    """Throughput gain of ``of`` over ``over`` at their best budgets (single request: TTFT ratio - 1)."""
    a, b = best(points, model, of, length), best(points, model, over, length)
    if a is None or b is None:
        return None
    return b.row.total / a.row.total - 1.0


def sweep_cells(points: list[Point], vpp: str = "vpp-async") -> list[Cell]:
    """Every long-sequence claim of the paper, in its metric (throughput gain, %); the 512K DCPP-over-CPP
    claim is Table 1's delta total and DeepSeek's 512K VPP-over-DCPP is Table 2(a)'s (not repeated)."""
    cells = []
    for (model, of, over), claims in paper.LONG_GAINS.items():
        strat = vpp if of == "vpp" else of
        name = f"{model}: {'VPP' if of == 'vpp' else of.upper()} over {over.upper()}"
        for length, value in claims.items():
            if model == "deepseek-v3.1" and length == 524288 and (of, over) in (("dcpp", "cpp"), ("vpp", "dcpp")):
                continue
            pv = tuple(100 * x for x in value) if isinstance(value, tuple) else 100 * value
            if length == "max":
                gains = [throughput_gain(points, model, strat, over, L) for L in paper.LONG_LENGTHS[model]]
                gains = [g for g in gains if g is not None]
                cells.append(Cell("Sweep", f"{name}, largest over lengths", pv, 100 * max(gains) if gains else None,
                                  "%", gain=True))
            else:
                g = throughput_gain(points, model, strat, over, length)
                cells.append(Cell("Sweep", f"{name}, {length // 1024}K", pv, None if g is None else 100 * g, "%",
                                  gain=True))
    return cells


def chunk_cells(points: list[Point], vpp: str = "vpp-async") -> list[Cell]:
    """The 24K tail effect: in how many (model, length) cells 24K is VPP's best budget ("most")."""
    cells_ = [(m, L) for m, Ls in paper.LONG_LENGTHS.items() for L in Ls]
    wins = sum(best(points, m, vpp, L).chunk == 24576 for m, L in cells_ if best(points, m, vpp, L) is not None)
    return [Cell("Chunk sensitivity", f"cells where 24K is VPP's best budget (of {len(cells_)})",
                 (len(cells_) // 2 + 1, len(cells_)), wins, "cells", "paper: 24K best in most configurations")]


def ablation_cells(rows: dict) -> list[Cell]:
    """Sec. 6.4: 3 x 256K DeepSeek requests in 32K chunks; ``rows`` maps "vpp", "vpp-async",
    "vpp-packed" to rows (profiler view)."""
    A = paper.ABLATION_256K
    b, a, p = rows["vpp"], rows["vpp-async"], rows["vpp-packed"]
    red = lambda x, y: 100 * (x - y) / x
    cells = [Cell("Ablation", "VPP-Async latency reduction vs VPP", 100 * A["async_gain"], red(b.total, a.total), "%",
                  gain=True),
             Cell("Ablation", "VPP-Async + packing reduction vs VPP", 100 * A["packing_gain_total"],
                  red(b.total, p.total), "%", gain=True),
             Cell("Ablation", "VPP-Async: non-overlapped comm. change vs VPP", -100 * A["async_exposed_cut"],
                  -red(b.exposed_comm, a.exposed_comm), "%", gain=True),
             Cell("Ablation", "VPP overlap ratio", 100 * A["overlap"]["vpp"], 100 * b.overlap_ratio, "%"),
             Cell("Ablation", "VPP-Async overlap ratio", 100 * A["overlap"]["vpp-async"], 100 * a.overlap_ratio, "%"),
             Cell("Ablation", "packing: cross-request bubble change vs VPP-Async", -100 * A["packing_bubble_cut"],
                  -red(a.bubble, p.bubble), "%", "model: bubble per rank", gain=True),
             Cell("Ablation", "compute spread over the three variants", A["compute_spread"],
                  max(r.compute for r in rows.values()) - min(r.compute for r in rows.values()), "s")]
    for s in ("vpp", "vpp-async", "vpp-packed"):
        label = strategies.get(s).label
        cells.append(Cell("Ablation", f"{label} bubble ratio", 100 * A["bubble_ratio"][s], 100 * rows[s].bubble_ratio, "%"))
    return cells


def stream_cells(results: dict) -> list[Cell]:
    """Fig. 3: ``results[(model, workload)]`` maps strategies to :class:`.serving.Served` (each at
    its best budget); workloads "mixed", "short-4K", "short-8K", "short-16K". The paper's VPP is VPP-Async
    + packing; gains are throughput gains."""
    def g(model, wl, over):
        rows = results.get((model, wl))
        return None if rows is None else 100 * (rows["vpp-packed"].stats.throughput / rows[over].stats.throughput - 1)

    cells = []
    for (model, over), value in paper.MIXED_GAINS.items():
        pv = tuple(100 * x for x in value) if isinstance(value, tuple) else 100 * value
        cells.append(Cell("Fig. 3 mixed", f"{model}: VPP over {over.upper()}", pv, g(model, "mixed", over), "%",
                          gain=True))
    shorts = ("short-4K", "short-8K", "short-16K")
    qwen = [x for x in (g("qwen3-coder-30b-a3b", w, "cpp") for w in shorts) if x is not None]
    ds = [x for x in (g("deepseek-v3.1", w, "dcpp") for w in shorts) if x is not None]
    near = [x for m in ("qwen3-coder-30b-a3b", "glm-5.2") for w in shorts for x in [g(m, w, "dcpp")] if x is not None]
    cells += [Cell("Fig. 3 short", "Qwen: VPP over CPP, worst length", 100 * paper.SHORT_CLAIMS["qwen_vs_cpp_worst"],
                   min(qwen) if qwen else None, "%", gain=True),
              Cell("Fig. 3 short", "DeepSeek: VPP over DCPP, best length", 100 * paper.SHORT_CLAIMS["deepseek_vs_dcpp_best"],
                   max(ds) if ds else None, "%", gain=True),
              Cell("Fig. 3 short", "Qwen and GLM: VPP over DCPP, worst length", 0.0,
                   min(near) if near else None, "%", "paper: 'comparable', 'almost no regression' (read as 0%)",
                   gain=True)]
    return cells
