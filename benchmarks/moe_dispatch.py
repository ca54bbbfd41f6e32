"""Time the MoE dispatch modes side by side on 2 gloo ranks (one thread each, pinned to a core).

Contenders, on the same tokens and the same (random) weights, in interleaved rounds:

* ``allreduce ep=2``  -- experts split over 2 EP ranks; every rank routes all tokens; one all-reduce.
* ``alltoall ep=2``   -- each rank routes half the tokens; counts, 2 all-to-alls, all-gather.
* ``allreduce ep=1``  -- every expert TP-sharded over both ranks (etp=2); one all-reduce.

Two shapes: ``compute`` (expert FLOPs dominate, as in prefill) and ``comm`` (thin experts, so the
dispatch overhead shows). Each forward is timed from a barrier to a barrier (the slowest rank).
Prints a table (median and min-max ms, and the per-round ratio to ``allreduce ep=2``) and writes it
to ``benchmarks/results/moe_dispatch.md`` with the command line.

    python -m benchmarks.moe_dispatch [--tokens 64 256 1024 4096] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


from vpp.parallel import initialize_model_parallel, narrowing, run_distributed
from vpp.transformer.moe import MoE, MoEConfig

SHAPES = {
    # hidden, moe_intermediate, experts, top_k, shared_intermediate
    "compute": MoEConfig(1024, 256, 16, 4, norm_topk_prob=True, shared_intermediate_size=512),
    "comm": MoEConfig(1024, 16, 16, 4, norm_topk_prob=True, shared_intermediate_size=32),
}
CONTENDERS = (("allreduce", 2), ("alltoall", 2), ("allreduce", 1))


def _load_random(moe: MoE, cfg: MoEConfig) -> None:
    g = torch.Generator().manual_seed(0)

    def get(name: str) -> torch.Tensor:
        shapes = {"gate.weight": (cfg.num_experts, cfg.hidden_size)}
        key = name.rsplit(".", 2)[-2] if name != "gate.weight" else name
        width = cfg.shared_intermediate_size if name.startswith("shared_experts.") else cfg.moe_intermediate_size
        shape = shapes.get(key) or ((cfg.hidden_size, width) if key == "down_proj" else (width, cfg.hidden_size))
        return torch.randn(shape, generator=g) / shape[-1] ** 0.5

    moe.load_checkpoint(narrowing(get), "")


def _rank(rank: int, world_size: int, shapes: list[str], tokens: list[int], rounds: int) -> dict:
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    groups = {ep: initialize_model_parallel(world_size, 1, ep) for ep in (1, 2)}
    times: dict = {}
    for shape in shapes:
        cfg = SHAPES[shape]
        blocks = {}
        for dispatch, ep in CONTENDERS:
            blocks[(dispatch, ep)] = MoE(cfg, groups[ep], dispatch=dispatch)
            _load_random(blocks[(dispatch, ep)], cfg)
        for t in tokens:
            x = torch.randn(t, cfg.hidden_size, generator=torch.Generator().manual_seed(t))
            for block in blocks.values():  # warm-up
                block(x)
            for _ in range(rounds):
                for key, block in blocks.items():
                    dist.barrier(groups[2].tp.pg)
                    start = time.perf_counter()
                    block(x)
                    dist.barrier(groups[2].tp.pg)
                    times.setdefault((shape, t, *key), []).append(time.perf_counter() - start)
    return times


def _table(times: dict, shapes: list[str], tokens: list[int]) -> str:
    base = CONTENDERS[0]
    head = "| shape | tokens | " + " | ".join(f"{d} ep={e} ms (min-max)" for d, e in CONTENDERS)
    head += " | " + " | ".join(f"{d} ep={e} / {base[0]} ep={base[1]}" for d, e in CONTENDERS[1:]) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(CONTENDERS) - 1)]
    for shape in shapes:
        for t in tokens:
            cells = [shape, str(t)]
            for key in CONTENDERS:
                ms = [s * 1e3 for s in times[(shape, t, *key)]]
                cells.append(f"{statistics.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f})")
            for key in CONTENDERS[1:]:
                ratios = [a / b for a, b in zip(times[(shape, t, *key)], times[(shape, t, *base)])]
                cells.append(f"{statistics.median(ratios):.2f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "moe_dispatch.md"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    times = run_distributed(_rank, 2, args.shapes, args.tokens, args.rounds, timeout=1800)[0]
    # other work on the machine shows in the load average: compare the ratios, not the times
    load = f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after (machine cores: {os.cpu_count()})"
    table = _table(times, args.shapes, args.tokens)
    print(f"{table}\n{load}")
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        shapes = "; ".join(f"{name}: {cfg.hidden_size=}, {cfg.moe_intermediate_size=}, {cfg.num_experts=}, "
                           f"{cfg.top_k=}, {cfg.shared_intermediate_size=}" for name, cfg in SHAPES.items())
        with open(args.out, "w") as f:
            f.write(f"# MoE dispatch, 2 gloo ranks x 1 thread, fp32, {args.rounds} rounds after a warm-up\n\n"
                    f"`python {' '.join(['-m', 'benchmarks.moe_dispatch', *sys.argv[1:]])}`\n\n{shapes.replace('cfg.', '')}\n\n"
                    f"{table}\n\n{load}\n")


if __name__ == "__main__":
    main()
