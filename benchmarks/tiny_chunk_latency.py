"""Prefill latency of the built-in tiny models, per 1K-token chunk and in total.

    python -m benchmarks.tiny_chunk_latency [--tokens 16384] [--chunk 1024] [--runs 3]

Per chunk: one stage holding every layer, one process, one thread; the median over runs of each
chunk's latency (first, middle and last chunk with the min-max spread, the last/first ratio, the
whole prefill), runs interleaved across models (A B C A B C ...). With ``--two-ranks`` it also times
a whole prefill on two ranks, each holding half the layers, chunks streamed rank 0 -> rank 1 (a
plain chunked pipeline written out here, not the project's executor).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vpp.models import build_stage, random_checkpoint
from vpp.models.tiny import TINY_CONFIGS
from vpp.parallel import ParallelGroups, run_distributed


def prompt(stage_vocab: int, tokens: int, seed: int) -> torch.Tensor:
    return torch.randint(0, stage_vocab, (tokens,), generator=torch.Generator().manual_seed(seed))


def prefill_times(stage, tokens: int, chunk: int, seed: int) -> list[float]:
    ids, times = prompt(stage.vocab_size, tokens, seed), []
    for start in range(0, tokens, chunk):
        t0 = time.perf_counter()
        stage(ids[start:start + chunk], "bench", start, last_token_only=True)
        times.append(time.perf_counter() - t0)
    stage.release("bench")
    return times


def two_rank_prefill(rank: int, world_size: int, name: str, tokens: int, chunk: int) -> float:
    import torch.distributed as dist
    from vpp.parallel import initialize_model_parallel, irecv, isend
    groups = initialize_model_parallel(1, 2)
    cfg = TINY_CONFIGS[name]
    half, n = cfg["num_hidden_layers"] // 2, cfg["num_hidden_layers"]
    stage = build_stage(cfg, (0, half) if rank == 0 else (half, n), groups, weights=random_checkpoint(cfg, 0))
    ids, sends = prompt(cfg["vocab_size"], tokens, 0), []
    dist.barrier()
    t0 = time.perf_counter()
    for start in range(0, tokens, chunk):
        if rank == 0:
            sends.append(isend(stage(ids[start:start + chunk], "bench", start), 1, groups.pp))
        else:
            h = torch.empty(min(chunk, tokens - start), cfg["hidden_size"])
            irecv(h, 0, groups.pp).wait()
            stage(h, "bench", start, last_token_only=True)
    for w in sends:
        w.wait()
    dist.barrier()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--models", nargs="*", default=list(TINY_CONFIGS))
    p.add_argument("--two-ranks", action="store_true", help="also time a whole prefill on two ranks")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    stages = {}
    for name in args.models:
        cfg = TINY_CONFIGS[name]
        stages[name] = build_stage(cfg, (0, cfg["num_hidden_layers"]), ParallelGroups.single(),
                                   weights=random_checkpoint(cfg, 0))
        prefill_times(stages[name], 2 * args.chunk, args.chunk, seed=0)  # warm-up
    runs = {name: [] for name in stages}
    for r in range(args.runs):
        for name, stage in stages.items():
            runs[name].append(prefill_times(stage, args.tokens, args.chunk, seed=r))
    print(f"{args.tokens} tokens in chunks of {args.chunk}, one thread, median [min-max] of {args.runs} runs")
    print(f"{'model':<14} {'first ms':>16} {'middle ms':>18} {'last ms':>18} {'last/first':>10} {'total s':>8}"
          + (f" {'2 ranks s':>9}" if args.two_ranks else ""))
    for name, rs in runs.items():
        cols = []
        for k in (0, len(rs[0]) // 2, len(rs[0]) - 1):
            values = [run[k] * 1e3 for run in rs]
            cols.append(f"{statistics.median(values):.0f} [{min(values):.0f}-{max(values):.0f}]")
        ratio = statistics.median(run[-1] / run[0] for run in rs)
        total = statistics.median(sum(run) for run in rs)
        line = f"{name:<14} {cols[0]:>16} {cols[1]:>18} {cols[2]:>18} {ratio:>10.1f} {total:>8.1f}"
        if args.two_ranks:
            line += f" {max(run_distributed(two_rank_prefill, 2, name, args.tokens, args.chunk, timeout=900)):>9.1f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
