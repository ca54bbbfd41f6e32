"""One chunk's attention on CPU: vpp's kernel against torch's CPU flash kernel, side by side.

    python -m benchmarks.attention_kernel [--prefixes 3072,7168,15360] [--chunk 1024] [--heads 8,2]
                                          [--width 64,64] [--reps 7] [--threads 1] [--out OUT]

A chunk of ``--chunk`` queries after a cached prefix of each length (bottom-right causal), fp32,
grouped-query heads (``--heads Hq,Hk``), widths ``--width D,Dv``. Contenders, interleaved per
repetition in one process: ``vpp`` (``vpp.transformer.attention.cpu_kernel``: one pass) and ``torch``
(the reference path, ``VPP_CPU_ATTENTION=torch``: torch's ``_scaled_dot_product_flash_attention_for_cpu``
on the prefix piece and the diagonal piece, merged by log-sum-exp). Prints per contender the median
and [min-max] milliseconds of ``--reps`` repetitions, the GFLOP/s of the median (4 x D-wide dot
products per visible (query, key) pair, counting the causal half of the diagonal only), the ratio
vpp / torch per repetition, and the largest difference between the two outputs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.attention_kernel", description=__doc__.split("\n\n")[0])
    p.add_argument("--prefixes", default="3072,7168,15360", help="comma-separated cached prefix lengths")
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--heads", default="8,2", help="query heads, key heads")
    p.add_argument("--width", default="64,64", help="query/key width, value width")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="write OUT.md")
    args = p.parse_args(argv)
    try:
        args.prefixes = [int(x) for x in args.prefixes.split(",") if x]
        args.heads = tuple(int(x) for x in args.heads.split(","))
        args.width = tuple(int(x) for x in args.width.split(","))
    except ValueError:
        p.error("--prefixes, --heads and --width take comma-separated integers")
    if len(args.heads) != 2 or args.heads[0] % args.heads[1] or len(args.width) != 2:
        p.error(f"--heads takes Hq,Hk with Hk dividing Hq and --width D,Dv, got {args.heads} and {args.width}")
    if args.reps < 1 or args.chunk < 1 or args.threads < 1 or min(args.prefixes, default=-1) < 0:
        p.error("--reps, --chunk and --threads take numbers >= 1, --prefixes numbers >= 0")
    return args


def _torch_path(q, k, v, scale):
    from vpp.transformer.attention import kernel
    old = os.environ.get("VPP_CPU_ATTENTION")
    os.environ["VPP_CPU_ATTENTION"] = "torch"
    try:
        return kernel.causal_attention(q, k, v, scale)
    finally:
        if old is None:
            del os.environ["VPP_CPU_ATTENTION"]
        else:
            os.environ["VPP_CPU_ATTENTION"] = old


def measure(args) -> list[dict]:
    from vpp.transformer.attention import cpu_kernel
    if cpu_kernel.library() is None:
        raise SystemExit(f"vpp's CPU attention kernel does not run here: {cpu_kernel.unavailable_reason()}")
    torch.set_num_threads(args.threads)
    (hq, hk), (d, dv), c = args.heads, args.width, args.chunk
    rows = []
    for prefix in args.prefixes:
        gen = torch.Generator().manual_seed(prefix)
        q = torch.randn(c, hq, d, generator=gen).transpose(0, 1)  # as the model hands it over: [Hq, c, D] view
        k, v = torch.randn(hk, prefix + c, d, generator=gen), torch.randn(hk, prefix + c, dv, generator=gen)
        scale = d ** -0.5
        runs = {"vpp": lambda: cpu_kernel.attention(q, k, v, scale, prefix)[0],
                "torch": lambda: _torch_path(q, k, v, scale)}
        times: dict = {name: [] for name in runs}
        outs = {name: fn() for name, fn in runs.items()}  # warm-up, and the outputs compared
        for _ in range(args.reps):
            for name, fn in runs.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        flop = 2 * (d + dv) * hq * (c * prefix + c * (c + 1) / 2)
        ratios = [a / b for a, b in zip(times["vpp"], times["torch"])]
        rows.append({"prefix": prefix, "diff": float((outs["vpp"] - outs["torch"]).abs().max()),
                     "ratio": (statistics.median(ratios), min(ratios), max(ratios)),
                     **{name: (statistics.median(ts), min(ts), max(ts), flop / statistics.median(ts) / 1e9)
                        for name, ts in times.items()}})
    return rows


def render(rows: list[dict], args) -> str:
    (hq, hk), (d, dv) = args.heads, args.width
    lines = ["# One chunk's attention on CPU: vpp's kernel vs torch's flash kernel", "",
             f"`python -m benchmarks.attention_kernel --prefixes {','.join(map(str, args.prefixes))} --chunk "
             f"{args.chunk} --heads {hq},{hk} --width {d},{dv} --reps {args.reps} --threads {args.threads}` "
             f"(fp32; CPU capability {torch.backends.cpu.get_cpu_capability()}; load average "
             f"{os.getloadavg()[0]:.2f})", "",
             "| prefix | vpp ms | vpp GFLOP/s | torch ms | torch GFLOP/s | vpp / torch | max diff |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        fmt = lambda t: f"{t[0] * 1e3:.1f} [{t[1] * 1e3:.1f}-{t[2] * 1e3:.1f}]"  # noqa: E731
        lines.append(f"| {r['prefix']} | {fmt(r['vpp'])} | {r['vpp'][3]:.0f} | {fmt(r['torch'])} | "
                     f"{r['torch'][3]:.0f} | {r['ratio'][0]:.3f} [{r['ratio'][1]:.3f}-{r['ratio'][2]:.3f}] | "
                     f"{r['diff']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    text = render(measure(args), args)
    print(text)
    if args.out:
        from vpp.safe_write import write_text
        write_text(args.out + ".md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
