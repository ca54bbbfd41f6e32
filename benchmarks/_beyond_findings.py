"""The Findings of beyond_paper.md, written from the numbers its sections computed.

Every figure in the prose is taken from the section data (``beyond_paper.json``), and every comparative
word ("grows", "stays", "within") is decided by those numbers, so the prose cannot drift from the
tables when the cost model moves (it did once: a literal notes file kept a fit two versions old).
A section that did not run (``--only``) or a point a ``--quick`` run skips leaves its sentence out.
"""

from __future__ import annotations

from benchmarks._report import kib

__all__ = ["findings"]

PAPER_BUDGETS = (8192, 16384, 24576, 32768)


def _pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


def _span(values, digits: int = 1, sign: bool = False) -> str:
    """'a-b%' over ``values`` (fractions); one value when they round the same."""
    sign = sign or min(values) < 0
    fmt = (lambda v: f"{100 * v:+.{digits}f}") if sign else (lambda v: f"{100 * v:.{digits}f}")
    lo, hi = fmt(min(values)), fmt(max(values))
    return f"{lo}%" if lo == hi else f"{lo} to {hi}%" if sign else f"{lo}-{hi}%"


def _gains(x: float) -> str:
    return f"gains {_pct(x)}" if x >= 0 else f"loses {_pct(-x)}"


def _runs(pairs):
    """[(length, name)] in length order -> 'name at 64K-256K, other at 512K-1024K'."""
    groups = []
    for length, name in pairs:
        if groups and groups[-1][0] == name:
            groups[-1][2] = length
        else:
            groups.append([name, length, length])
    return ", ".join(f"{n} at {kib(a)}" + (f"-{kib(b)}" if b != a else "") for n, a, b in groups)


def pipeline_depth(data: list[dict]) -> str:
    at = {(d["pp"], d["length"], d["layout"]): d for d in data}
    pps = sorted({d["pp"] for d in data})
    lengths = sorted({d["length"] for d in data})
    v1, cpp = "V f=1 async", "CPP (loop)"

    def gain(pp, length, layout):
        return at[(pp, length, cpp)]["ttft"] / at[(pp, length, layout)]["ttft"] - 1

    def best(pp, length):
        return min((d for d in data if d["pp"] == pp and d["length"] == length), key=lambda d: d["ttft"])

    parts = []
    for pp in (pps[0], pps[-1]):
        bubbles = [at[(pp, L, v1)]["bubble_ratio"] for L in lengths]
        gains = [gain(pp, L, v1) for L in lengths]
        parts.append(f"at PP = {pp} the V with one fold leaves {_span(bubbles, 0)} of rank-time idle and gains "
                     f"{_span(gains)} over CPP")
    text = "**Pipeline depth.** Over " + ", ".join(kib(L) for L in lengths) + ": " + "; ".join(parts) + "."
    short, deep = lengths[0], pps[-1]
    chunks = short // at[(deep, short, v1)]["chunk"]
    if chunks < 2 * deep:
        text += (f" (At PP = {deep} the V has {2 * deep} stages and a {kib(short)} prompt at its best budget is "
                 f"{chunks} chunks: the pipeline never fills.)")
    top = {L: best(deep, L) for L in lengths}
    text += (f" The best layout at PP = {deep} ({_runs([(L, top[L]['layout']) for L in lengths])}) gains "
             f"{_span([gain(deep, L, top[L]['layout']) for L in lengths], 0)} over CPP.")
    mid = sorted(lengths)[len(lengths) // 2] if 524288 not in lengths else 524288
    text += (f" At {kib(mid)} the best layout's gain over CPP by depth: " +
             ", ".join(f"{_pct(gain(pp, mid, best(pp, mid)['layout']))} (PP = {pp})" for pp in pps) + ".")
    ratios = [at[(d["pp"], d["length"], f"interleaved f={f} async")]["ttft"] / d["ttft"] - 1
              for d in data for f in (1, 2, 3) if d["layout"] == f"V f={f} async"
              and (d["pp"], d["length"], f"interleaved f={f} async") in at]
    if ratios:
        text += (f" With non-blocking transfers an interleaved layout's TTFT differs from the V's with the same "
                 f"folds by {_span(ratios, 1, sign=True)} (negative: the interleaved layout is faster).")
    text += f" The best layout at PP = {pps[0]}: {_runs([(L, best(pps[0], L)['layout']) for L in lengths])}."
    return text


def sparse_attention(dsa: dict) -> str:
    fits = {a: [f for f in dsa["tau"] if f["attention"] == a] for a in ("DSA", "dense MLA")}
    worst = max(fits["DSA"], key=lambda f: f["max_resid"])
    text = (f"**Sparse attention (DSA).** In the model DSA's tau_k stays affine in k (R^2 >= "
            f"{min(f['r2'] for f in fits['DSA']):.4f}, worst residual {_pct(worst['max_resid'])} at "
            f"{kib(worst['chunk'])} chunks); what departs from Eq. 2 is the intercept: alpha/beta = "
            f"{min(f['alpha_over_beta'] for f in fits['DSA']):.1f}-{max(f['alpha_over_beta'] for f in fits['DSA']):.1f}"
            f" against Eq. 2's 1 (dense MLA: {min(f['alpha_over_beta'] for f in fits['dense MLA']):.1f}-"
            f"{max(f['alpha_over_beta'] for f in fits['dense MLA']):.1f}).")
    share = dsa["breakdown"]
    text += (f" At a 112K prefix (16K chunk) the replicated lightning indexer takes {_pct(share.get('indexer', 0), 0)} "
             f"of a DSA stage's time and attention {_pct(share.get('attention', 0), 0)}.")
    rem = {(r["attention"], r["length"]): r for r in dsa["remedies"]}
    lengths = sorted({r["length"] for r in dsa["remedies"]})
    first, last = lengths[0], lengths[-1]
    bub = {a: [rem[(a, L)]["bubble"] for L in lengths] for a in ("DSA", "dense MLA")}
    more = any(b > m + 0.005 for b, m in zip(bub["DSA"], bub["dense MLA"]))
    text += (f" Since Eq. 3b needs only an affine tau_k, DSA leaves VPP-Async "
             f"{'more' if more else 'at most half a point more'} bubble than dense MLA does in the model ({' / '.join(_pct(b) for b in bub['DSA'])} against "
             f"{' / '.join(_pct(b) for b in bub['dense MLA'])} at {' / '.join(kib(L) for L in lengths)}).")
    if len(lengths) > 1:
        d0, d1 = rem[("DSA", first)]["vpp_vs_cpp"], rem[("DSA", last)]["vpp_vs_cpp"]
        m0, m1 = rem[("dense MLA", first)]["vpp_vs_cpp"], rem[("dense MLA", last)]["vpp_vs_cpp"]
        text += (f" VPP's gain over CPP {'narrows' if d1 < d0 else 'does not narrow'} with length (DSA "
                 f"{_pct(d0)} -> {_pct(d1)} from {kib(first)} to {kib(last)}, dense {_pct(m0)} -> {_pct(m1)}).")
    text += (" The paper puts its narrowing on GLM down to DSA breaking the linear tau_k; that needs a tau_k "
             "that bends in k on the real kernels (top-k selection or gathers whose cost per key changes with the "
             "prefix), which a roofline model cannot see: timing tau_k of real DSA layers is the test (the review's "
             "Sec. 9, item 4).")
    d = [rem[("DSA", L)] for L in lengths]
    text += (" The remedies a large intercept calls for shorten the V's fill and drain: a head/tail taper of the "
             f"chunk sizes ({' / '.join(_pct(r['taper'], 1) for r in d)} over VPP-Async), a second fold "
             f"({' / '.join(_pct(r['folds2']) for r in d)}), both ({' / '.join(_pct(r['both']) for r in d)}) at "
             f"{' / '.join(kib(L) for L in lengths)}, bringing VPP's gain over CPP on DSA to "
             f"{_pct(d[0]['remedied_vs_cpp'])} at {kib(first)} (from {_pct(d[0]['vpp_vs_cpp'])}).")
    what = {(w["eff_topk"], w["length"]): w for w in dsa["whatif"]}
    slow = min(w["eff_topk"] for w in dsa["whatif"] if w["eff_topk"] is not None)
    short = min(w["length"] for w in dsa["whatif"])
    base, worst_k = what[(None, short)], what[(slow, short)]
    text += (f" A slow top-k (what-if, prompted by the CPU calibration) steepens tau_k: at {slow:g} of bandwidth "
             f"VPP-Async {_gains(worst_k['vs_cpp'])} against CPP at {kib(short)} (baseline {_pct(base['vs_cpp'])}) "
             f"and {_span([w['vs_dcpp'] for (e, _), w in what.items() if e == slow])} against DCPP, which pays no "
             f"prefix rebuild on DSA. At the baseline top-k speed VPP-Async {_gains(base['vs_dcpp'])} against DCPP "
             f"at {kib(short)}; the paper reports 8.5% over DCPP for GLM at 64K.")
    return text


def memory(mem: dict, kv_bytes: dict) -> str:
    rows = [dict(zip(("model", "length", "schedule", "weights", "kv", "act", "total", "fits"), r)) for r in mem["rows"]]
    heavy = [m for m in kv_bytes if kv_bytes[m] == 1]
    text = "**Memory.** Weights dominate (" + ", ".join(
        f"{max(r['weights'] for r in rows if r['model'] == m):.0f} GB per NPU for {m}" for m in heavy) + ")."
    ds = heavy[0] if heavy else rows[0]["model"]
    extra = [a["act"] - b["act"] for a in rows for b in rows if a["model"] == b["model"] == ds
             and a["length"] == b["length"] and a["schedule"] == "vpp-async" and b["schedule"] == "vpp"]
    more = f"{min(extra):.1f}" if f"{min(extra):.1f}" == f"{max(extra):.1f}" else f"{min(extra):.1f}-{max(extra):.1f}"
    text += (f" VPP-Async holds one more chunk's activations than vanilla VPP (+{more} GB for {ds} at 24K chunks), "
             f"the \"one extra in-flight batch\" the paper leaves unquantified.")
    least = all(r["act"] == min(o["act"] for o in rows if o["model"] == r["model"] and o["length"] == r["length"])
                for r in rows if r["schedule"] == "dcpp")
    if least:
        text += " DCPP holds no more activations than any other schedule."
    longest = {x["model"]: x for x in mem["longest"]}
    for m in heavy:
        at512 = [r for r in rows if r["model"] == m and r["length"] == "512K" and r["schedule"] == "vpp-async"]
        if at512:
            bf16 = at512[0]["total"] + at512[0]["kv"] * (2 / kv_bytes[m] - 1)
            text += (f" {m} at 512K with VPP-Async needs {at512[0]['total']:.1f} GB per NPU with its 8-bit KV cache"
                     f" and {bf16:.1f} GB with a BF16 one ({'over' if bf16 > 64 else 'within'} the 910C's 64 GB);"
                     f" the longest prompt that fits is {kib(longest[m]['bf16'])} with BF16 KV, "
                     f"{kib(longest[m]['int8'])} with 8-bit.")
    return text


def tuner(found: list[dict]) -> str:
    done = [f for f in found if "tuned" in f]
    ref = [f for f in done if f["model"] == "deepseek-v3.1" and f["pp"] == 2 and f["length"] == 524288]
    text = "**Auto-tuner.**"
    if ref:
        text += (" For DeepSeek at 512K on PP = 2 the tuner gains " + " / ".join(
            f"{_pct(f['gain'])} ({f['search']})" for f in ref) + " over the paper's configuration (one-fold V, 24K, async).")
    rest = [f for f in done if f not in ref]
    if rest:
        folds = sum(f["folds"] > 1 for f in rest)
        taper = sum(f["taper"] for f in rest)
        text += (f" {'Elsewhere' if ref else 'In every case'} it finds {_span([f['gain'] for f in rest])} more "
                 f"(pipeline layouts only here; regrouping the devices for context parallelism is in cp_compare.md); "
                 f"{folds} of its {len(rest)} winners use a second or third fold and {taper} a head/tail taper.")
    ext = [f for f in done if f["search"] == "extended"]
    if ext:
        between = sum(f["chunk"] not in PAPER_BUDGETS for f in ext)
        text += f" With extended budgets {between} of {len(ext)} winners use a budget outside the paper's four."
    none = [f for f in found if "tuned" not in f]
    if none:
        text += " Nothing fits for " + ", ".join(sorted({f"{f['model']} at {kib(f['length'])}" for f in none})) + "."
    return text


def devices(rows: list, handover_s: float | None) -> str:
    r = [dict(zip(("model", "device", "length", "cpp", "dcpp", "vpp"), x[:6])) for x in rows]
    gpu = [x for x in r if not x["device"].startswith("910C")]
    npu = {(x["model"], x["length"]): x for x in r if x["device"].startswith("910C")}
    text = "**GPUs.** The same 16-device deployment on H100/H200 (GPU efficiencies assumed rather than fitted)"
    ds = [x for x in gpu if x["model"] == "deepseek-v3.1"]
    if ds:
        speed = [npu[(x["model"], x["length"])]["vpp"] / x["vpp"] for x in ds]
        text += f" runs DeepSeek's VPP-Async {min(speed):.1f}-{max(speed):.1f}x faster than the 910C"
    text += "; VPP-Async's gains: " + "; ".join(
        f"{m} {_span([(x['cpp'] - x['vpp']) / x['cpp'] for x in gpu if x['model'] == m])} over CPP and "
        f"{_span([(x['dcpp'] - x['vpp']) / x['dcpp'] for x in gpu if x['model'] == m])} over DCPP"
        for m in dict.fromkeys(x["model"] for x in gpu)) + " on the GPUs."
    long = [x for x in gpu if x["model"] == "deepseek-v3.1" and x["length"] == "512K"]
    if long and ("deepseek-v3.1", "512K") in npu:
        n = npu[("deepseek-v3.1", "512K")]
        text += (f" Over DCPP at 512K: {_pct((n['dcpp'] - n['vpp']) / n['dcpp'])} on the 910C, " +
                 ", ".join(f"{_pct((x['dcpp'] - x['vpp']) / x['dcpp'])} on {x['device']}" for x in long) + ".")
    if handover_s is not None:
        text += f" A 24K-token hand-over across the nodes takes {1e3 * handover_s:.1f} ms in the model (H100)."
    return text


def findings(blob: dict, kv_bytes: dict, handover_s: float | None = None) -> str:
    parts = ["## Findings", ""]
    if "pp" in blob:
        parts += [pipeline_depth(blob["pp"]), ""]
    if "dsa" in blob:
        parts += [sparse_attention(blob["dsa"]), ""]
    if "memory" in blob:
        parts += [memory(blob["memory"], kv_bytes), ""]
    if "tune" in blob:
        parts += [tuner(blob["tune"]["found"]), ""]
    if "devices" in blob:
        parts += [devices(blob["devices"]["rows"], handover_s), ""]
    return "\n".join(parts)
