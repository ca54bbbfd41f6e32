"""Why the V gains little or much over CPP on a 6-layer model on 2 ranks: its drain, in closed form and
simulated (no ranks, no timing noise).

    python benchmarks/v_drain.py [--a-ms 70] [--b-ms 48] [--chunks 4,8,16] [--quick]

Per layer, chunk k costs ``tau'_k = a + b k`` ms (default: tiny-deepseek in 1K-token chunks, from the
16K-token measurement in :mod:`vpp.models.tiny`: 421 + 290 k ms for six layers; chunks twice as long
roughly double ``a`` and quadruple ``b``). A rank holds three
layers, so its work on chunk k is ``tau_k = 3 tau'_k`` and its total ``S = sum_k tau_k``. Closed forms:
CPP takes ``S + tau_{N-1}`` (rank 1 runs the last chunk alone); the paper's V with rank 0's work split
evenly between s0 and s3 ``S + (tau_0 + tau_{N-1}) / 2`` (tau_{k-1} + tau_{k+1} = 2 tau_k leaves only
the fill and the drain; it holds while ``b <= a``, else rank 1 waits for s0/C1 too, whose half of
``tau_1`` outlasts ``tau_0``). The table adds VPP-Async simulated on the two rank-balanced splits of six
layers (1/1/2/2: two layers in the drain; 2/1/2/1: one) and on the best split of rank 0's work in steps
of 1/8 layer (``s0 share``). ``--quick``: chunk counts 4 and 8 only.
"""

from __future__ import annotations

import argparse

from vpp.schedules import LinearCost, make_layout, strategies
from vpp.schedules.runner import simulate

C = 1024


def makespan(schedule: str, weights: tuple[float, ...], n: int, a: float, b: float) -> float:
    kind = strategies.get(schedule).layout
    layout = make_layout(kind, 6, 2, partition=(3, 3) if kind == "loop" else (2, 1, 2, 1))  # weights set the costs
    cost = LinearCost(per_token=a / C, per_token_prefix=b / C ** 2, stage_weights=weights)
    return simulate(schedule, layout, n * C, cost, chunk_size=C).trace.makespan  # one prompt of n chunks


def rows(a: float, b: float, chunk_counts) -> list[list]:
    out = []
    for n in chunk_counts:
        tau = [3 * (a + b * k) for k in range(n)]
        s = sum(tau)
        cpp, even = s + tau[-1], s + (tau[0] + tau[-1]) / 2
        sim_cpp = makespan("cpp", (3.0, 3.0), n, a, b)
        sim_even = makespan("vpp-async", (1.5, 1.5, 1.5, 1.5), n, a, b)
        assert abs(sim_cpp - cpp) <= 1e-9 * cpp, (n, sim_cpp, cpp)
        if b <= a:
            assert abs(sim_even - even) <= 1e-9 * even, (n, sim_even, even)
        v1122 = makespan("vpp-async", (1.0, 1.0, 2.0, 2.0), n, a, b)
        v2121 = makespan("vpp-async", (2.0, 1.0, 2.0, 1.0), n, a, b)
        share, best = min(((x / 8, makespan("vpp-async", (x / 8, 1.5, 1.5, 3 - x / 8), n, a, b)) for x in range(1, 24)),
                          key=lambda t: t[1])
        out.append([n, round(cpp), f"{sim_even / cpp:.3f}", f"{v1122 / cpp:.3f}", f"{v2121 / cpp:.3f}",
                    f"{best / cpp:.3f} (s0 {share:g} of 3 layers)"])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a-ms", type=float, default=70.0, help="per-layer cost of the first chunk, ms (default 70)")
    p.add_argument("--b-ms", type=float, default=48.0, help="per-layer growth per chunk, ms (default 48)")
    p.add_argument("--chunks", default="4,8,16", help="chunk counts (default 4,8,16)")
    p.add_argument("--quick", action="store_true", help="chunk counts 4 and 8 only")
    args = p.parse_args(argv)
    counts = [4, 8] if args.quick else [int(x) for x in args.chunks.split(",")]
    print(f"tau'_k = {args.a_ms:g} + {args.b_ms:g} k ms per layer for chunk k, 6 layers on 2 ranks; "
          f"makespan / CPP's, VPP-Async")
    print("| chunks | CPP ms (S + tau_N-1) | even V (b <= a: S + (tau_0 + tau_N-1)/2) | 1/1/2/2 | 2/1/2/1 | best split |")
    print("|---|---|---|---|---|---|")
    for r in rows(args.a_ms, args.b_ms, counts):
        print("| " + " | ".join(str(v) for v in r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
