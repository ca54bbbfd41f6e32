"""One MoE layer's routed experts on one CPU core: vpp's fused kernel (vpp.transformer.cpu_ops) against
the reference path (index_select, one torch.mm per expert and projection, silu * up, mul, index_add_),
interleaved in one process, on benchmarks/vs_vllm.py's Qwen3-MoE shapes (1024-token chunk, hidden 512,
8 experts of width 512, top-2) by default.

    python -m benchmarks.moe_kernel [--tokens 1024] [--hidden 512] [--inter 512] [--experts 8] [--top-k 2]
                                    [--rounds 5] [--out OUT]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.moe_kernel", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--inter", type=int, default=512)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=10, help="calls per timed round")
    p.add_argument("--out", default=None, help="write OUT.md")
    args = p.parse_args(argv)
    if min(args.tokens, args.hidden, args.inter, args.experts, args.top_k, args.rounds, args.calls) < 1 \
            or args.top_k > args.experts:
        p.error("every size must be >= 1, and --top-k <= --experts")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from vpp.transformer import cpu_ops
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    gen = torch.Generator().manual_seed(0)
    t, h, inter, e, k = args.tokens, args.hidden, args.inter, args.experts, args.top_k
    x = torch.randn(t, h, generator=gen)
    gate_up = torch.randn(e, 2 * inter, h, generator=gen) / h ** 0.5
    down = torch.randn(e, h, inter, generator=gen) / inter ** 0.5
    weights, ids = torch.randn(t, e, generator=gen).softmax(-1).topk(k, -1)
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    tokens, w, counts = order // k, weights.flatten()[order], torch.bincount(flat, minlength=e).tolist()

    def reference():
        rows = x.index_select(0, tokens)
        g = x.new_empty(rows.shape[0], 2 * inter)
        start = 0
        for i, n in enumerate(counts):
            torch.mm(rows[start:start + n], gate_up[i].t(), out=g[start:start + n])
            start += n
        a = F.silu(g[:, :inter]).mul_(g[:, inter:])
        y, start = torch.empty_like(rows), 0
        for i, n in enumerate(counts):
            torch.mm(a[start:start + n], down[i].t(), out=y[start:start + n])
            start += n
        return torch.zeros_like(x).index_add_(0, tokens, y.mul_(w.unsqueeze(1)))

    runs = {"reference": reference}
    if cpu_ops.supports(x, gate_up, down, "silu"):
        runs["vpp"] = lambda: cpu_ops.experts(x, tokens, w, counts, list(range(e)), gate_up, down, threads=1)
    diff = float((runs["vpp"]() - reference()).abs().max()) if "vpp" in runs else float("nan")
    flops = 2 * t * k * 3 * h * inter
    times: dict = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            fn()
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - start) / args.calls)
    lines = [f"`python -m benchmarks.moe_kernel --tokens {t} --hidden {h} --inter {inter} --experts {e} "
             f"--top-k {k} --rounds {args.rounds}`", "",
             f"One thread, pinned; median [min-max] of {args.rounds} interleaved rounds of {args.calls} calls; "
             f"max |vpp - reference| = {diff:.2e}.", "",
             "| path | ms per call | GFLOP/s | time / reference |", "|---|---|---|---|"]
    ref = statistics.median(times["reference"])
    for name, ts in times.items():
        med = statistics.median(ts)
        lines.append(f"| {name} | {med * 1e3:.2f} [{min(ts) * 1e3:.2f}-{max(ts) * 1e3:.2f}] | {flops / med / 1e9:.0f} | "
                     f"{med / ref:.2f} |")
    if "vpp" not in runs:
        lines.append(f"\nvpp's kernel did not run here: {cpu_ops.unavailable_reason() or 'not fp32/SiLU'}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        from vpp.safe_write import write_text
        write_text(args.out + ".md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
