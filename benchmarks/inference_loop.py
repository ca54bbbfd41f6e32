"""The inference loop's own costs, measured on this machine (spawned CPU ranks, one thread each).

1. Repeated prefill: the one-shot ``forward_prefill`` (start-up exchange, plan build and verification
   every call) against ``Pipeline.prefill`` on a pipeline built once (one small exchange of the
   prompts' lengths, a cached plan), interleaved, on a short prompt where that overhead shows.
2. Decode: time per output token of ``Pipeline.generate`` (greedy, one request) for each tiny model
   at PP 1 and PP 2 (a V), and the TTFT of its prefill.

    python -m benchmarks.inference_loop [--rounds 7] [--out benchmarks/results/inference_loop.md] [--quick]

``--quick``: one model, a 128-token prompt in chunks of 32, 4 new tokens (a smoke run, not a measurement).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch


from vpp.models.registry import open_model
from vpp.parallel import initialize_model_parallel, run_distributed
from vpp.runtime import Pipeline, forward_prefill


def _stats(values) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def _pin(groups) -> None:
    if groups.sizes.world_size <= (os.cpu_count() or 1):
        os.sched_setaffinity(0, {groups.global_rank % (os.cpu_count() or 1)})


def _setup(world, model_name, tokens):
    """This rank's groups, stages of a V, whether it holds stage 0, a random prompt and a Pipeline."""
    groups = initialize_model_parallel(1, world)
    _pin(groups)
    model = open_model(model_name)
    stages = model.stages(model.layout("v", world), groups)
    ids = torch.randint(0, model.config["vocab_size"], (tokens,), generator=torch.Generator().manual_seed(0))
    return groups, stages, any(s.is_first for s in stages), ids, Pipeline(stages, groups)


def overhead(rank, world, model_name, tokens, chunk, rounds):
    groups, stages, first, ids, pipe = _setup(world, model_name, tokens)
    times = {"one-shot forward_prefill": [], "Pipeline.prefill": []}

    def one_shot():
        return forward_prefill(stages, ids if first else None, chunk, groups, schedule="vpp-async")

    def repeated():
        return pipe.prefill(ids if first else None, chunk, schedule="vpp-async")

    for r in range(rounds + 1):
        for name, fn in (("one-shot forward_prefill", one_shot), ("Pipeline.prefill", repeated)):
            torch.distributed.barrier()
            start = time.perf_counter()
            fn()
            torch.distributed.barrier()
            if r:  # round 0 warms up
                times[name].append((time.perf_counter() - start) * 1e3)
            for s in stages:
                s.release(0)
    return times


def decode(rank, world, model_name, tokens, chunk, new):
    _, _, first, ids, pipe = _setup(world, model_name, tokens)
    pipe.generate(ids[:chunk] if first else None, 2, chunk, schedule="vpp-async")  # warm up
    gen = pipe.generate(ids if first else None, new, chunk, schedule="vpp-async")
    return gen.ttft_s, gen.time_per_output_token_s


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=os.path.join("benchmarks", "results", "inference_loop.md"))
    p.add_argument("--quick", action="store_true", help="one model, a short prompt, few tokens (a smoke run)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    models = ("tiny-deepseek",) if args.quick else ("tiny-qwen", "tiny-deepseek", "tiny-glm")
    prompt, chunk, new = (128, 32, 4) if args.quick else (512, 128, 32)
    lines = ["# The inference loop's own costs (measured)", "",
             f"`python -m benchmarks.inference_loop --rounds {args.rounds}{' --quick' if args.quick else ''}`; "
             "spawned CPU ranks, one thread each, pinned; median [min-max].", ""]
    times = run_distributed(overhead, 2, "tiny-deepseek", 256, 64, args.rounds, timeout=1800)[0]
    one, rep = times["one-shot forward_prefill"], times["Pipeline.prefill"]
    saved = [a - b for a, b in zip(one, rep)]
    lines += ["## Repeated prefill: tiny-deepseek, 256 tokens in chunks of 64, VPP-Async on a V, PP 2", "",
              "| call | ms per prefill |", "|---|---|",
              f"| one-shot `forward_prefill` (exchange + plan + verify each call) | {_stats(one)} |",
              f"| `Pipeline.prefill` (pipeline built once, cached plan) | {_stats(rep)} |",
              f"| saved per call (paired rounds) | {_stats(saved)} |", ""]
    lines += [f"## Decode: greedy, one request, {prompt}-token prompt in chunks of {chunk}, {new} new tokens", "",
              "| model | PP | TTFT s | ms per output token |", "|---|---|---|---|"]
    for name in models:
        for pp in (1, 2):
            ttft, tpot = run_distributed(decode, pp, name, prompt, chunk, new, timeout=1800)[0]
            lines.append(f"| {name} | {pp} | {ttft:.3f} | {1e3 * tpot:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
