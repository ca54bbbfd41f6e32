"""Beyond the paper, in simulation at paper scale (same fitted 910C device as paper_repro.py).

    python -m benchmarks.beyond_paper [--out benchmarks/results] [--only pp,dsa,memory,tune,devices] [--quick]

1. Pipeline depth: PP = 2, 4, 8 (TP8 each): CPP vs the V vs more folds vs Megatron-interleaved layouts;
   the best layout per depth and length and the bubble it leaves.
2. Sparse attention: tau_k of GLM-5.2's DSA layers against the same model with dense MLA; departure from
   Eq. 2; the bubble it leaves VPP; the head/tail taper planner and a second fold as remedies.
3. Memory per rank (weights, KV cache, peak activations) for each schedule, and the longest prompt that
   fits 64 GB.
4. The auto-tuner (`vpp tune`) against the paper's best configuration.
5. The same deployment on H100 / H200 (16 GPUs: TP8 in a node, PP across two nodes).
Writes beyond_paper.md, beyond_paper.json and PNGs. ``--quick`` runs every section on fewer budgets, lengths
and tuner cases (:data:`QUICK`): a smoke run of the code paths, not a result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from vpp.perf.arch import Arch
from vpp.perf.configs import get_config
from vpp.perf.hardware import H100, H200
from vpp.perf.decompose import decompose
from vpp.perf.rank_memory import kv_bytes_per_token_layer, rank_memory
from benchmarks._beyond_findings import findings
from benchmarks._report import figure, kib, md_table, save
from vpp.perf.runs import Setup, run
from benchmarks.paper.sweep import KV_BYTES, MODELS, fitted_setups, paper_setup
from vpp.perf.taper import best_taper
from vpp.perf.deployment_search import NothingFits, paper_best, tune
from vpp.schedules.ir import Request

CHUNKS = (8192, 16384, 24576, 32768)
LENGTHS = (65536, 131072, 262144, 524288, 1048576)
LAYOUTS = (("CPP (loop)", "cpp", "loop", 1), ("V f=1 blocking (VPP)", "vpp", "v", 1),
           ("V f=1 async", "vpp-async", "v", 1), ("V f=2 async", "vpp-async", "v", 2),
           ("V f=3 async", "vpp-async", "v", 3), ("interleaved f=1 async", "vpp-async", "interleaved", 1),
           ("interleaved f=2 async", "vpp-async", "interleaved", 2), ("interleaved f=3 async", "vpp-async", "interleaved", 3))


@dataclass(frozen=True)
class Sizes:
    """What the sections sweep: chunk budgets, prompt lengths (pipeline depth), lengths of the DSA
    remedies, the tuner's (PP, length) cases and models, and whether it also searches extended budgets."""
    chunks: tuple = CHUNKS
    lengths: tuple = LENGTHS
    dsa_lengths: tuple = (65536, 131072, 262144, 524288)
    tune_cases: tuple = ((2, 131072), (2, 524288), (4, 524288))
    tune_models: tuple = MODELS
    extended: bool = True


FULL = Sizes()
# the figures' own points (16K budget, 512K prompt) stay in, so every section and figure still runs
QUICK = Sizes(chunks=(16384, 24576), lengths=(131072, 524288), dsa_lengths=(131072,), tune_cases=((2, 131072),),
              tune_models=MODELS[:1], extended=False)


def best_over_chunks(setup, strategy, length, kind, folds, chunks=CHUNKS):
    best = None
    for c in chunks:
        r = run(setup, strategy, [length], c, kind=kind, folds=folds)
        row = decompose("x", r.plan, r.trace, r.cost, view="simulator")
        if best is None or row.total < best[0].total:
            best = (row, c)
    return best


def section_pp(device, model="deepseek-v3.1", out_dir=None, sizes=FULL):
    lines = [f"## 1. Pipeline depth ({model}, TP8 x PP = 2, 4, 8)", "",
             "TTFT (s) at each layout's best budget; bubble = idle + waiting share of rank-time "
             "(simulator view). Speed-up is over CPP at its best budget.", ""]
    data, fig_rows = [], {}
    for pp in (2, 4, 8):
        setup = paper_setup(model, device, pp=pp)
        body = []
        for L in sizes.lengths:
            res = {name: best_over_chunks(setup, strat, L, kind, f, sizes.chunks) for name, strat, kind, f in LAYOUTS
                   if kind == "loop" or 2 * f * pp <= setup.arch.layers}
            cpp = res["CPP (loop)"][0].total
            top = min(res, key=lambda n: res[n][0].total)
            v1 = res["V f=1 async"][0]
            body.append([kib(L), f"{cpp:.1f} ({100 * res['CPP (loop)'][0].bubble_ratio:.0f}%)",
                         f"{v1.total:.1f} ({100 * v1.bubble_ratio:.1f}%)", f"{cpp / v1.total:.3f}",
                         f"{top} [{kib(res[top][1])}]", f"{res[top][0].total:.1f}", f"{cpp / res[top][0].total:.3f}",
                         f"{100 * res[top][0].bubble_ratio:.1f}%"])
            for name, (row, c) in res.items():
                data.append({"pp": pp, "length": L, "layout": name, "chunk": c, "ttft": row.total,
                             "bubble_ratio": row.bubble_ratio})
                if L == 524288:
                    fig_rows.setdefault(name, {})[pp] = cpp / row.total
        lines += [f"PP = {pp}:", "", md_table(["length", "CPP (bubble)", "V f=1 async (bubble)", "speed-up",
                                                "best layout [budget]", "best TTFT", "speed-up", "bubble left"], body), ""]
    if out_dir:
        fig = figure(8, 4)
        ax = fig.add_subplot()
        for name, by_pp in fig_rows.items():
            ax.plot(sorted(by_pp), [by_pp[p] for p in sorted(by_pp)], marker="o", label=name)
        ax.set_xlabel("pipeline ranks (PP)")
        ax.set_ylabel("TTFT speed-up over CPP at 512K")
        ax.set_xticks([2, 4, 8])
        ax.legend(fontsize=7)
        save(fig, out_dir, "pp_depth_512k.png")
        lines += ["Figure: pp_depth_512k.png", ""]
    return "\n".join(lines), data


def dense_variant(setup: Setup) -> Setup:
    cfg = get_config("glm-5.2")
    for k in ("index_topk", "index_head_dim", "index_n_heads"):
        cfg.pop(k)
    cfg["model_type"] = "deepseek_v3"
    return Setup(Arch.from_config(cfg, name="glm-5.2-dense-mla"), setup.device, setup.par, setup.pp)


def tau_curve(setup, chunk, length):
    """Per-stage time of the V's stage 1 (no embedding/head) for each fixed-size chunk."""
    cost = setup.cost(setup.layout("v"))
    n = length // chunk
    tau = np.array([cost.compute(1, chunk, k * chunk) for k in range(n)])
    k = np.arange(n)
    (alpha, beta), *_ = np.linalg.lstsq(np.vstack([np.ones(n), k]).T, tau, rcond=None)
    fit = alpha + beta * k
    r2 = 1 - ((tau - fit) ** 2).sum() / ((tau - tau.mean()) ** 2).sum()
    eq2 = tau[0] * (k + 1)                       # Eq. 2 anchored at the first chunk
    return tau, alpha, beta, r2, np.abs(tau - fit).max() / tau.mean(), np.abs(tau - eq2).max() / tau.max()


def section_dsa(setups, out_dir=None, sizes=FULL):
    glm = setups["glm-5.2"]
    dense = dense_variant(glm)
    lines = ["## 2. Sparse attention (DSA) and VPP", "",
             "tau_k: per-stage time of chunk k (stage 1 of the V, 19-20 layers) at a fixed budget over 128K. "
             "Eq. 2 is tau_k = (k+1) tau_0; Eq. 3b needs only tau affine in k.", ""]
    body, curves, fits = [], {}, []
    for name, s in (("GLM-5.2 DSA", glm), ("GLM-5.2 dense MLA", dense)):
        for c in sizes.chunks:
            tau, a, b, r2, res, dev = tau_curve(s, c, 131072)
            curves[(name, c)] = tau
            fits.append({"attention": "DSA" if s is glm else "dense MLA", "chunk": c, "alpha_over_beta": a / b,
                         "r2": r2, "max_resid": res, "max_dev_eq2": dev})
            body.append([name, kib(c), f"{tau[0]:.3f}", f"{tau[-1]:.3f}", f"{a:.3f}", f"{b:.4f}", f"{a / b:.1f}",
                         f"{r2:.4f}", f"{100 * res:.1f}%", f"{100 * dev:.0f}%"])
    lines += [md_table(["model", "budget", "tau_0 (s)", "tau_last", "alpha", "beta", "alpha/beta (Eq.2: 1)",
                        "R^2 affine", "max affine resid.", "max dev. from Eq.2"], body), ""]
    cost = glm.cost(glm.layout("v"))
    bd = cost.breakdown(1, 16384, 131072 - 16384)
    tot = sum(bd.values())
    shares = {k: v / tot for k, v in bd.items()}
    lines += ["Where a DSA stage's time goes (16K chunk at 112K prefix): " +
              ", ".join(f"{k} {100 * v / tot:.0f}%" for k, v in sorted(bd.items(), key=lambda kv: -kv[1]) if v / tot > 0.01), ""]
    rows, remedies = [], []
    for name, s in (("DSA", glm), ("dense MLA", dense)):
        for L in sizes.dsa_lengths:
            cpp = min(run(s, "cpp", [L], c).row.total for c in sizes.chunks)
            base = min(((run(s, "vpp-async", [L], c), c) for c in sizes.chunks), key=lambda rc: rc[0].row.total)
            sim = decompose("x", base[0].plan, base[0].trace, base[0].cost, view="simulator")
            f2 = min(run(s, "vpp-async", [L], c, folds=2).row.total for c in sizes.chunks)
            tap = min(best_taper(lambda sz: run(s, "vpp-async", [L], c, requests=[Request(0, tuple(sz))]).row.total,
                                 L, c)[3] for c in sizes.chunks)
            both = min(best_taper(lambda sz: run(s, "vpp-async", [L], c, folds=2,
                                                 requests=[Request(0, tuple(sz))]).row.total, L, c)[3] for c in sizes.chunks)
            v = base[0].row.total
            remedies.append({"attention": name, "length": L, "cpp": cpp, "vpp_async": v, "bubble": sim.bubble_ratio,
                             "vpp_vs_cpp": (cpp - v) / cpp, "taper": (v - tap) / v, "folds2": (v - f2) / v,
                             "both": (v - both) / v, "remedied_vs_cpp": (cpp - both) / cpp})
            rows.append([name, kib(L), f"{cpp:.2f}", f"{v:.2f} [{kib(base[1])}]", f"{100 * sim.bubble_ratio:.1f}%",
                         f"{100 * (cpp - v) / cpp:+.1f}%", f"{100 * (v - tap) / v:+.1f}%", f"{100 * (v - f2) / v:+.1f}%",
                         f"{100 * (v - both) / v:+.1f}%", f"{100 * (cpp - both) / cpp:+.1f}%"])
    lines += ["VPP-Async at its best budget, the bubble it keeps, and the remedies' gains over it (each at its "
              "own best budget):", "",
              md_table(["attention", "length", "CPP best", "VPP-Async [budget]", "VPP bubble", "VPP vs CPP",
                        "taper", "2 folds", "taper + 2 folds", "remedied VPP vs CPP"], rows), ""]
    what, whatif = [], []
    for eff in (None, 0.1, 0.03):
        s = paper_setup("glm-5.2", glm.device.replace(eff_irregular=eff))
        for L in (65536, 131072):
            t = {st: min(run(s, st, [L], c).row.total for c in sizes.chunks) for st in ("cpp", "dcpp", "vpp-async")}
            whatif.append({"eff_topk": eff, "length": L, "vs_cpp": (t["cpp"] - t["vpp-async"]) / t["cpp"],
                           "vs_dcpp": (t["dcpp"] - t["vpp-async"]) / t["dcpp"]})
            what.append(["as memory (baseline)" if eff is None else f"{eff} of bandwidth", kib(L), t["cpp"],
                         f"{100 * (t['cpp'] - t['vpp-async']) / t['cpp']:+.1f}%",
                         f"{100 * (t['dcpp'] - t['vpp-async']) / t['dcpp']:+.1f}%"])
    lines += ["What if top-k selection runs far below memory bandwidth (on this CPU it runs at ~1/36 of copy "
              "bandwidth, cpu_calibration.md)? It steepens tau_k (its cost grows with the prefix):", "",
              md_table(["top-k speed", "length", "CPP (s)", "VPP-Async vs CPP", "VPP-Async vs DCPP"], what), ""]
    if out_dir:
        fig = figure(8, 4)
        ax = fig.add_subplot()
        for (name, c), tau in curves.items():
            if c == 16384:
                k = np.arange(len(tau))
                ax.plot(k, tau, marker="o", label=f"{name}")
                ax.plot(k, tau[0] * (k + 1), ls=":", color=ax.lines[-1].get_color(), label=f"Eq. 2 from tau_0 ({name})")
        ax.set_xlabel("chunk index k (16K chunks, 128K prompt)")
        ax.set_ylabel("stage time tau_k (s)")
        ax.legend(fontsize=7)
        save(fig, out_dir, "dsa_tau_k.png")
        lines += ["Figure: dsa_tau_k.png", ""]
    return "\n".join(lines), {"rows": rows, "tau": fits, "breakdown": shares, "remedies": remedies, "whatif": whatif}


def section_memory(setups):
    lines = ["## 3. Memory per rank (GB; the larger of the two ranks)", "",
             "Weights as held by one TP rank (W8A8 for DeepSeek/GLM, BF16 for Qwen), the KV cache of the whole "
             "prompt in the format the model is run with (" + ", ".join(
                 f"{m}: {'BF16' if KV_BYTES.get(m, 2) == 2 else f'{8 * KV_BYTES[m]}-bit'}" for m in MODELS) +
             "; `benchmarks.paper.sweep.KV_BYTES`), peak activations from the simulated timeline (budget 24K).", ""]
    body = []
    for model in MODELS:
        for L in (131072, 524288):
            for strat, folds in (("cpp", 1), ("dcpp", 1), ("vpp", 1), ("vpp-async", 1), ("vpp-async", 2)):
                r = run(setups[model], strat, [L], 24576, folds=folds)
                mem = max(rank_memory(r.plan, r.trace, r.cost), key=lambda m: m.total)
                name = strat + (f" f={folds}" if folds > 1 else "")
                body.append([model, kib(L), name, mem.weights / 1e9, mem.kv_cache / 1e9, mem.activations / 1e9,
                             mem.total / 1e9, "yes" if mem.total <= 64e9 else "NO"])
    lines += [md_table(["model", "length", "schedule", "weights", "KV cache", "activations", "total", "fits 64 GB"], body), ""]
    fit_rows, longest = [], []
    for model in MODELS:
        s = setups[model]
        r = run(s, "vpp-async", [131072], 24576)
        mem = max(rank_memory(r.plan, r.trace, r.cost), key=lambda m: m.total)
        layers = max(sum(len(s.layout("v").layers_of(st)) for st in s.layout("v").stages_of(rk)) for rk in range(2))
        per_value = kv_bytes_per_token_layer(s.arch, s.par) / s.par.kv_bytes * layers  # cached values per token
        free = 64e9 - mem.weights - mem.activations
        bf16, int8 = int(free / (2 * per_value)) // 1024 * 1024, int(free / per_value) // 1024 * 1024
        longest.append({"model": model, "bf16": bf16, "int8": int8})
        fit_rows.append([model, f"{2 * per_value / 1024:.0f} KiB", kib(bf16), kib(int8)])
    lines += ["Longest prompt whose KV cache fits next to the weights and VPP-Async's activations in 64 GB:", "",
              md_table(["model", "BF16 KV per token per rank", "BF16 KV", "8-bit KV"], fit_rows), ""]
    return "\n".join(lines), {"rows": body, "longest": longest}


def section_tune(setups, sizes=FULL):
    lines = ["## 4. Auto-tuner vs the paper's best configuration", "",
             "`vpp tune` searches loop/V/interleaved x folds 1-3 x even/balanced partition x budgets x "
             "blocking/async (and DCPP on the loop), then tapers the best few. Extended budgets add 12K, 20K, "
             "40K and 48K to the paper's four.", ""]
    body, found = [], []
    ext = (8192, 12288, 16384, 20480, 24576, 32768, 40960, 49152)
    searches = (("paper budgets", sizes.chunks), ("extended", ext))[:2 if sizes.extended else 1]
    for model in sizes.tune_models:
        for pp, L in sizes.tune_cases:
            s = paper_setup(model, setups[model].device, pp=pp)
            base = paper_best(s, L)
            for label, chunks in searches:
                try:
                    best = tune(s, L, chunks=chunks, max_folds=3, cp=False)[0]   # CP: cp_compare.py
                except NothingFits as e:  # the paper's best may not fit either: say so, with the figures
                    body.append([model, pp, kib(L), label, f"{base.ttft:.2f}", "-", "-", f"nothing fits: {e}"])
                    found.append({"model": model, "pp": pp, "length": L, "search": label, "paper": base.ttft})
                    continue
                c = best.candidate
                found.append({"model": model, "pp": pp, "length": L, "search": label, "paper": base.ttft,
                              "tuned": best.ttft, "gain": (base.ttft - best.ttft) / base.ttft, "folds": c.folds,
                              "kind": c.kind, "taper": c.chunking != "fixed", "chunk": c.chunk})
                body.append([model, pp, kib(L), label, f"{base.ttft:.2f}", f"{best.ttft:.2f}",
                             f"{100 * (base.ttft - best.ttft) / base.ttft:+.1f}%", best.candidate.describe()])
    lines += [md_table(["model", "PP", "length", "search", "paper best (s)", "tuned (s)", "gain", "tuned configuration"],
                       body), ""]
    return "\n".join(lines), {"rows": body, "found": found}


def section_devices(setups, sizes=FULL):
    lines = ["## 5. The same deployment on GPUs", "",
             "16 devices, TP8 x PP2, DeepSeek and Qwen; GPUs with FP8 weights for DeepSeek (its W8A8 analogue), BF16 for Qwen; "
             "GPU efficiencies are the presets' assumptions (not fitted), the 910C row is the fitted one. "
             "TTFT (s) at each strategy's best budget.", ""]
    body = []
    for model in ("deepseek-v3.1", "qwen3-coder-30b-a3b"):
        for dev_name, dev in (("910C (fitted)", setups[model].device), ("H100", H100), ("H200", H200)):
            s = paper_setup(model, dev)
            for L in (131072, 524288):
                t = {st: min(run(s, st, [L], c).row.total for c in sizes.chunks) for st in ("cpp", "dcpp", "vpp-async")}
                body.append([model, dev_name, kib(L), t["cpp"], t["dcpp"], t["vpp-async"],
                             f"{100 * (t['cpp'] - t['vpp-async']) / t['cpp']:+.1f}%",
                             f"{100 * (t['dcpp'] - t['vpp-async']) / t['dcpp']:+.1f}%"])
    lines += [md_table(["model", "device", "length", "CPP", "DCPP", "VPP-Async", "VPP vs CPP", "VPP vs DCPP"], body), ""]
    return "\n".join(lines), {"rows": body}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--only", default="pp,dsa,memory,tune,devices")
    ap.add_argument("--quick", action="store_true", help="fewer budgets, lengths and tuner cases (a smoke run)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    setups, fit = fitted_setups()
    parts = ["# Beyond the paper (simulated, paper scale)", "",
             f"Command: `python -m benchmarks.beyond_paper{' --quick' if args.quick else ''}`. Device: Ascend 910C die with " + fit.describe() + ".", ""]
    blob = {}
    todo = args.only.split(",")
    if "pp" in todo:
        text, blob["pp"] = section_pp(setups["deepseek-v3.1"].device, out_dir=args.out, sizes=sizes)
        parts.append(text)
    if "dsa" in todo:
        text, blob["dsa"] = section_dsa(setups, out_dir=args.out, sizes=sizes)
        parts.append(text)
    if "memory" in todo:
        text, blob["memory"] = section_memory(setups)
        parts.append(text)
    if "tune" in todo:
        text, blob["tune"] = section_tune(setups, sizes)
        parts.append(text)
    if "devices" in todo:
        text, blob["devices"] = section_devices(setups, sizes)
        parts.append(text)
    gpu = paper_setup("deepseek-v3.1", H100)
    parts.append(findings(blob, KV_BYTES, handover_s=gpu.cost(gpu.layout("v")).transfer(24576)))
    parts.append(f"_Generated in {time.time() - t0:.0f} s._")
    md = "\n".join(parts)
    with open(os.path.join(args.out, "beyond_paper.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "beyond_paper.json"), "w") as f:
        json.dump(blob, f, indent=1, default=str)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
