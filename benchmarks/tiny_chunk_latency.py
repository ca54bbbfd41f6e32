"""Per-chunk prefill latency of the built-in tiny models (one stage holding every layer, one process).

    python benchmarks/tiny_chunk_latency.py [--tokens 16384] [--chunk 1024] [--runs 3] [--threads 1]

Prints, per model, the median over runs of each chunk's latency (first, middle, last chunk and the
last/first ratio), with the min-max spread; runs are interleaved across models (A B C A B C ...).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vpp.models import build_stage, random_checkpoint
from vpp.models.tiny import TINY_CONFIGS
from vpp.parallel import ParallelGroups


def prefill_times(stage, tokens: int, chunk: int, seed: int) -> list[float]:
    ids = torch.randint(0, stage.vocab_size, (tokens,), generator=torch.Generator().manual_seed(seed))
    times = []
    for start in range(0, tokens, chunk):
        t0 = time.perf_counter()
        stage(ids[start:start + chunk], "bench", start, last_token_only=True)
        times.append(time.perf_counter() - t0)
    stage.release("bench")
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--models", nargs="*", default=list(TINY_CONFIGS))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    groups = ParallelGroups.single()
    stages = {}
    for name in args.models:
        cfg = TINY_CONFIGS[name]
        stages[name] = build_stage(cfg, (0, cfg["num_hidden_layers"]), groups, weights=random_checkpoint(cfg, 0))
        prefill_times(stages[name], 2 * args.chunk, args.chunk, seed=0)  # warm-up
    runs = {name: [] for name in stages}
    for r in range(args.runs):
        for name, stage in stages.items():
            runs[name].append(prefill_times(stage, args.tokens, args.chunk, seed=r))
    print(f"{args.tokens} tokens in chunks of {args.chunk}, {args.threads} thread(s), median of {args.runs} runs (ms)")
    print(f"{'model':<15} {'first':>16} {'middle':>16} {'last':>16} {'last/first':>10} {'total s':>8}")
    for name, rs in runs.items():
        cols = []
        for k in (0, len(rs[0]) // 2, len(rs[0]) - 1):
            values = [run[k] * 1e3 for run in rs]
            cols.append(f"{statistics.median(values):6.0f} [{min(values):.0f}-{max(values):.0f}]")
        ratio = statistics.median(run[-1] / run[0] for run in rs)
        total = statistics.median(sum(run) for run in rs)
        print(f"{name:<15} {cols[0]:>16} {cols[1]:>16} {cols[2]:>16} {ratio:>10.1f} {total:>8.1f}")


if __name__ == "__main__":
    main()
