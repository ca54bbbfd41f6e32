"""Reproduce the VPP paper's long-sequence results in simulation, at paper scale.

    python benchmarks/paper_repro.py [--out benchmarks/results] [--quick]

DeepSeek-V3.1, GLM-5.2 and Qwen3-Coder-30B-A3B on TP8 + PP2 (16 Ascend 910C NPUs), 64K..1M tokens,
chunk budgets {8K, 16K, 24K, 32K}; CPP vs DCPP (vLLM-Ascend planner, profiled on the cost model) vs VPP
(vanilla, Async, Async + packing when a packing builder exists). Two device efficiencies are fitted on the
paper's DeepSeek 512K CPP row only (vpp.perf.fit); every other number is a prediction. Writes
paper_repro.md, paper_repro.json and PNGs to the output folder. Runs in well under a minute here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from vpp.bench import paper  # noqa: E402
from vpp.plan import strategies  # noqa: E402
from vpp.bench.fit import fit_cpp  # noqa: E402
from _report import figure, kib, md_table, pct, save  # noqa: E402
from vpp.perf.runs import Setup, run  # noqa: E402
from vpp.bench.sweep import MODELS, at, best, fitted_setups, paper_setup, sweep  # noqa: E402

STRATS = strategies.PLANNED
LABEL = {s: strategies.get(s).label for s in STRATS}
TOL = 0.10


def table_512k(setups):
    ds = setups["deepseek-v3.1"]
    rows = {s: run(ds, s, [524288], 24576) for s in ("cpp", "dcpp", "vpp", "vpp-async")}
    return {s: r.row for s, r in rows.items()}, rows


def section_512k(rows, fit) -> tuple[str, dict]:
    P = paper.TABLE_512K
    pairs = [("CPP", P["cpp"], rows["cpp"]), ("DCPP", P["dcpp"], rows["dcpp"]),
             ("VPP (paper) vs VPP-Async (model)", P["vpp"], rows["vpp-async"]),
             ("VPP (paper) vs vanilla VPP (model)", P["vpp"], rows["vpp"])]
    body = []
    for name, p, m in pairs:
        body.append([name, p["compute"], m.compute, p["bubble"], m.bubble, p["exposed_comm"], m.exposed_comm,
                     p["bubble"] + p["exposed_comm"], m.bubble + m.exposed_comm, p["total"], m.total,
                     pct(m.total, p["total"])])
    hdr = ["row", "compute paper", "model", "bubble paper", "model", "exp.comm paper", "model",
           "bubble+comm paper", "model", "total paper", "model", "total err"]
    verdict = {n: abs(m.total - p["total"]) / p["total"] <= TOL for n, p, m in pairs[:3]}
    order_m = sorted(("cpp", "dcpp", "vpp-async"), key=lambda s: rows[s].total)
    order_p = sorted(("cpp", "dcpp", "vpp"), key=lambda s: P[s]["total"])
    lines = ["## 1. DeepSeek-V3.1, 512K tokens, 24K budget (Tables 1 and 2)", "",
             "Seconds per rank. Model rows use the profiler view of waiting (see the notes).", "",
             md_table(hdr, body), "",
             f"Totals within {int(TOL * 100)}%: " + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in verdict.items())
             + f"; ordering model {' < '.join(LABEL[s] for s in order_m)}, paper {' < '.join(s.upper() for s in order_p)}.",
             "", "Fitted on the CPP row only: " + fit.describe() + ".", ""]
    # signs of every difference in Table 1 (DCPP - CPP) and Table 2 (VPP - DCPP)
    sign_rows = []
    for tab, a, b, pa, pb in (("T1 DCPP-CPP", rows["dcpp"], rows["cpp"], P["dcpp"], P["cpp"]),
                              ("T2 VPP-DCPP", rows["vpp-async"], rows["dcpp"], P["vpp"], P["dcpp"])):
        for k in ("compute", "bubble", "exposed_comm", "total"):
            dm, dp = getattr(a, k) - getattr(b, k), pa[k] - pb[k]
            sign_rows.append([tab, k, dp, dm, "yes" if (dm > 0) == (dp > 0) else "NO"])
    lines += ["Differences (paper vs model) and whether their signs agree:", "",
              md_table(["table", "row", "paper delta", "model delta", "same sign"], sign_rows), ""]
    D = paper.COMPUTE_DETAIL_512K
    det = [["Attention", D["dcpp"]["Attention"], rows["dcpp"].categories.get("attention", 0),
            D["vpp"]["Attention"], rows["vpp-async"].categories.get("attention", 0)],
           ["Slice ~ prefix rebuild copies", D["dcpp"]["Slice"], rows["dcpp"].categories.get("prefix_mem", 0),
            D["vpp"]["Slice"], rows["vpp-async"].categories.get("prefix_mem", 0)],
           ["MatMulV3 ~ prefix up-projection", D["dcpp"]["MatMulV3"], rows["dcpp"].categories.get("prefix_gemm", 0),
            D["vpp"]["MatMulV3"], rows["vpp-async"].categories.get("prefix_gemm", 0)]]
    other = lambda r: r.compute - sum(r.categories.get(k, 0) for k in ("attention", "prefix_mem", "prefix_gemm"))
    det.append(["other computation", paper.TABLE_512K["dcpp"]["compute"] - sum(D["dcpp"].values()), other(rows["dcpp"]),
                paper.TABLE_512K["vpp"]["compute"] - sum(D["vpp"].values()), other(rows["vpp-async"])])
    lines += ["Table 2(b), computation detail:", "",
              md_table(["kernels", "DCPP paper", "DCPP model", "VPP paper", "VPP model"], det), ""]
    gain = (rows["dcpp"].total - rows["vpp-async"].total) / rows["dcpp"].total
    gain_v = (rows["dcpp"].total - rows["vpp"].total) / rows["dcpp"].total
    lines += [f"VPP over DCPP at 512K / 24K: VPP-Async {100 * gain:.1f}%, vanilla VPP {100 * gain_v:.1f}% "
              f"(paper: about {100 * paper.VPP_OVER_DCPP_512K:.1f}%, profiler net {100 * 40.36 / 322.22:.2f}%).", ""]
    steps = rows["dcpp"].chunks / rows["cpp"].chunks
    lines += [f"Scheduling steps at 512K/24K: CPP {rows['cpp'].chunks}, DCPP {rows['dcpp'].chunks} "
              f"({steps:.2f}x; paper 4.4x).", ""]
    data = {k: v.to_dict() for k, v in rows.items()}
    return "\n".join(lines), data


def section_constants(device, fit) -> str:
    rows = []
    for name in ("peak_flops", "lowp_speedup", "mem_bw", "mem_bytes", "link_bw", "eff_matmul", "eff_mem",
                 "eff_attn", "eff_link", "link_latency", "kernel_overhead"):
        v = getattr(device, name)
        src = device.sources.get(name, "")
        rows.append([name, f"{v:.4g}", ("FITTED: " if name in ("eff_attn", "eff_link") else "") + src])
    return "\n".join(["## 0. Constants (Ascend 910C die, the paper's NPU)", "",
                      md_table(["constant", "value", "source"], rows), "",
                      "Deployment: TP8 x PP2 (16 NPUs), experts over the 8 TP ranks (EP8, tokens replicated, "
                      "combined by all-reduce), vLLM's PP hand-over (hidden + residual, 1/8 per rank then "
                      "all-gather); W8A8 weights for DeepSeek-V3.1 and GLM-5.2, BF16 for Qwen3-30B-A3B; BF16 "
                      "activations and KV cache. DCPP: vLLM-Ascend's planner (min chunk 4096, smoothing 1.0) "
                      "profiled on the model's last-rank stage. Layer split: even (DeepSeek 31/30 on the loop, "
                      "16/15/15/15 on the V).", ""])


def section_steps(setups) -> str:
    ds = setups["deepseek-v3.1"]
    online = Setup(ds.arch, ds.device, ds.par, ds.pp, dcpp_online=True)
    sglang = Setup(ds.arch, ds.device, ds.par, ds.pp, dcpp_variant="sglang")
    out = []
    for budget in paper.CHUNKS:
        cpp = run(ds, "cpp", [131072], budget).row.chunks
        dc = run(ds, "dcpp", [131072], budget)
        on = run(online, "dcpp", [131072], budget)
        sg = run(sglang, "dcpp", [131072], budget).row.chunks
        out.append([kib(budget), cpp, dc.row.chunks, on.row.chunks, sg, " ".join(
            kib(n) if n % 1024 == 0 else str(n) for n in dc.requests[0].chunk_sizes)])
    big = [run(s, "dcpp", [524288], 24576) for s in (ds, online, sglang)]
    return "\n".join(["## 2. Scheduling steps at 128K (Fig. 1b: CPP 8 steps, DCPP 17)", "",
                      "vLLM-Ascend planner profiled on the model's stage, without and with its online re-fit "
                      "(each chunk's simulated time fed back), and SGLang's planner for comparison.", "",
                      md_table(["budget", "CPP steps", "DCPP steps", "DCPP online re-fit", "DCPP SGLang",
                                "DCPP chunk sizes (no re-fit)"], out), "",
                      f"At 512K / 24K: DCPP {big[0].row.chunks} steps (TTFT {big[0].row.total:.1f} s), with online "
                      f"re-fit {big[1].row.chunks} ({big[1].row.total:.1f} s), SGLang planner {big[2].row.chunks} "
                      f"({big[2].row.total:.1f} s); CPP 22.", ""])


def section_sweep(points) -> str:
    lines = ["## 3. Long sequences: TTFT (s) at each strategy's best budget", "",
             "Best budget in brackets. Gains are TTFT reductions; the paper's ranges are in the last column.", ""]
    claims = {"deepseek-v3.1": paper.CLAIMS["vpp_vs_dcpp_deepseek"] + "; " + paper.CLAIMS["dcpp_vs_cpp"],
              "glm-5.2": paper.CLAIMS["vpp_vs_dcpp_glm"], "qwen3-coder-30b-a3b": paper.CLAIMS["vpp_vs_dcpp_qwen"]}
    for model in MODELS:
        body = []
        for L in paper.LENGTHS:
            b = {s: best(points, model, s, L) for s in STRATS}
            cell = lambda s: None if b[s] is None else f"{b[s].row.total:.1f} [{kib(b[s].chunk)}]"
            c, d, a = (b[s].row.total for s in ("cpp", "dcpp", "vpp-async"))
            body.append([kib(L), cell("cpp"), cell("dcpp"), cell("vpp"), cell("vpp-async"),
                         cell("vpp-packed"),
                         f"{100 * (c - d) / c:+.1f}%", f"{100 * (d - a) / d:+.1f}%", f"{100 * (c - a) / c:+.1f}%"])
        lines += [f"### {model}", "", f"Paper: {claims[model]}.", "",
                  md_table(["length", "CPP", "DCPP", "VPP", "VPP-Async", "VPP-Async+pack", "DCPP vs CPP",
                            "VPP-Async vs DCPP", "VPP-Async vs CPP"], body), ""]
    return "\n".join(lines)


def section_chunks(points) -> str:
    lines = ["## 4. Chunk-size sensitivity of VPP-Async (the 24K tail effect)", "",
             "TTFT (s) per budget; the best per row in bold. Paper: 24K best in most configurations, smaller "
             "chunks best at 64K on DeepSeek and GLM.", ""]
    wins = 0
    for model in MODELS:
        body = []
        for L in paper.LENGTHS:
            vals = {c: at(points, model, "vpp-async", L, c).row.total for c in paper.CHUNKS}
            top = min(vals, key=vals.get)
            wins += top == 24576
            body.append([kib(L)] + [f"**{v:.1f}**" if c == top else f"{v:.1f}" for c, v in vals.items()])
        lines += [f"{model}:", "", md_table(["length"] + [kib(c) for c in paper.CHUNKS], body), ""]
    lines += [f"24K is the best budget in {wins} of {len(MODELS) * len(paper.LENGTHS)} (model, length) cells.", ""]
    return "\n".join(lines)


def section_ablation(setups) -> str:
    ds = setups["deepseek-v3.1"]
    rows = {s: run(ds, s, [262144] * 3, 32768) for s in ("vpp", "vpp-async", "vpp-packed")}
    A = paper.ABLATION_256K
    v = rows["vpp"].row.total
    body = []
    for s, r in rows.items():
        body.append([LABEL[s], r.row.total, f"{100 * (v - r.row.total) / v:.2f}%", A["bubble_ratio"][s] * 100,
                     r.row.bubble_ratio * 100])
    return "\n".join(["## 5. Ablation: DeepSeek 256K, 32K chunks, 3 requests back to back (Sec. 6.4)", "",
                      f"Paper: Async -{A['async_gain'] * 100:.2f}%, + packing -{A['packing_gain_total'] * 100:.2f}% "
                      "in all, vs vanilla VPP.", "",
                      md_table(["variant", "TTFT of the batch (s)", "gain vs VPP", "bubble ratio % paper",
                                "bubble ratio % model"], body), ""])


SENSITIVITY = (("eff_matmul 0.5", {"eff_matmul": 0.5}), ("eff_matmul 0.9", {"eff_matmul": 0.9}),
               ("eff_mem 0.6", {"eff_mem": 0.6}), ("eff_mem 1.0", {"eff_mem": 1.0}),
               ("kernel_overhead 5 us", {"kernel_overhead": 5e-6}), ("kernel_overhead 20 us", {"kernel_overhead": 20e-6}),
               ("link_latency 5 us", {"link_latency": 5e-6}), ("link_latency 40 us", {"link_latency": 40e-6}),
               ("BF16 weights", "bf16"), ("what-if: 17 ms host step overhead", {"step_overhead": 17e-3}))


def section_sensitivity(base_device) -> str:
    P = paper.TABLE_512K
    body = []
    for name, change in (("baseline", {}),) + SENSITIVITY:
        setup = paper_setup("deepseek-v3.1", base_device)
        if change == "bf16":
            setup.par = type(setup.par)(tp=8, weight_bytes=2)
        else:
            setup.device = setup.device.replace(**change)
        fitted, fit = fit_cpp(setup)
        r = {s: run(fitted, s, [524288], 24576).row for s in ("cpp", "dcpp", "vpp-async")}
        body.append([name, f"{fit.eff_attn:.3f}", f"{fit.eff_link:.3f}", r["cpp"].total, pct(r["cpp"].total, P["cpp"]["total"]),
                     r["dcpp"].total, pct(r["dcpp"].total, P["dcpp"]["total"]), r["vpp-async"].total,
                     pct(r["vpp-async"].total, P["vpp"]["total"]), r["dcpp"].chunks])
    return "\n".join(["## 6. Sensitivity to the assumed constants (each re-fitted on the CPP row)", "",
                      md_table(["change", "eff_attn", "eff_link", "CPP", "err", "DCPP", "err", "VPP-Async", "err",
                                "DCPP steps"], body), ""])


def figures(setups, points, rows512, out) -> list[str]:
    paths = []
    ds = setups["deepseek-v3.1"]
    for s, budget in (("cpp", 16384), ("dcpp", 16384), ("vpp-async", 16384)):
        r = run(ds, s, [131072], budget)
        path = os.path.join(out, f"timeline_128k_{s}.png")
        r.trace.plot(path, title=f"DeepSeek-V3.1 128K, {LABEL[s]}, budget 16K: TTFT {r.row.total:.1f} s, "
                                 f"{r.row.chunks} chunks")
        paths.append(path)
    fig = figure(11, 3.6)
    for i, model in enumerate(MODELS):
        ax = fig.add_subplot(1, 3, i + 1)
        for s in ("dcpp", "vpp", "vpp-async"):
            ys = [best(points, model, "cpp", L).row.total / best(points, model, s, L).row.total for L in paper.LENGTHS]
            ax.plot(range(len(paper.LENGTHS)), ys, marker="o", label=LABEL[s])
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(paper.LENGTHS)), [kib(L) for L in paper.LENGTHS])
        ax.set_title(model, fontsize=9)
        ax.set_ylabel("speed-up over CPP (TTFT)" if i == 0 else "")
    ax.legend(fontsize=8)
    paths.append(save(fig, out, "speedup_vs_length.png"))
    fig = figure(7, 4)
    ax = fig.add_subplot()
    names = ["cpp", "dcpp", "vpp"]
    mrows = [rows512["cpp"], rows512["dcpp"], rows512["vpp-async"]]
    for j, (label, key) in enumerate((("compute", "compute"), ("bubble", "bubble"), ("exposed comm", "exposed_comm"))):
        base_p = [sum(paper.TABLE_512K[n][k] for k in ("compute", "bubble", "exposed_comm")[:j]) for n in names]
        base_m = [sum(getattr(r, k) for k in ("compute", "bubble", "exposed_comm")[:j]) for r in mrows]
        ax.bar([3 * i for i in range(3)], [paper.TABLE_512K[n][key] for n in names], 0.9, bottom=base_p,
               color=f"C{j}", label=label)
        ax.bar([3 * i + 1 for i in range(3)], [getattr(r, key) for r in mrows], 0.9, bottom=base_m, color=f"C{j}",
               hatch="//")
    ax.set_xticks([3 * i + 0.5 for i in range(3)], ["CPP\npaper | model", "DCPP\npaper | model", "VPP\npaper | model"])
    ax.set_ylabel("seconds per rank")
    ax.set_title("DeepSeek-V3.1 512K: paper (plain) vs model (hatched)", fontsize=9)
    ax.legend(fontsize=8)
    paths.append(save(fig, out, "breakdown_512k.png"))
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--quick", action="store_true", help="skip the sensitivity table and figures")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    setups, fit = fitted_setups()
    rows512, _ = table_512k(setups)
    strategies = list(STRATS)
    points = sweep(setups, strategies, paper.LENGTHS, paper.CHUNKS)
    text, data = section_512k(rows512, fit)
    parts = ["# VPP paper reproduction (simulated, paper scale)", "",
             "Command: `python benchmarks/paper_repro.py`.", "",
             section_constants(setups["deepseek-v3.1"].device, fit), text, section_steps(setups), section_sweep(points), section_chunks(points), section_ablation(setups)]
    if not args.quick:
        parts.append(section_sensitivity(setups["deepseek-v3.1"].device.replace(eff_attn=0.5, eff_link=0.8)))
        figs = figures(setups, points, rows512, args.out)
        parts += ["Figures: " + ", ".join(os.path.basename(p) for p in figs), ""]
    notes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper_repro_notes.md")
    if os.path.exists(notes):
        parts += [open(notes).read()]
    parts.append(f"_Generated in {time.time() - t0:.0f} s._")
    md = "\n".join(parts)
    with open(os.path.join(args.out, "paper_repro.md"), "w") as f:
        f.write(md)
    blob = {"fit": {"eff_attn": fit.eff_attn, "eff_link": fit.eff_link}, "table_512k": data,
            "sweep": [{"model": p.model, "strategy": p.strategy, "length": p.length, "chunk": p.chunk, **p.row.to_dict()}
                      for p in points]}
    with open(os.path.join(args.out, "paper_repro.json"), "w") as f:
        json.dump(blob, f, indent=1)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
