"""An inference loop through the API: load once, prefill prompt after prompt with VPP-Async, decode
new tokens from the caches the prefill left, release them.

    python examples/generate.py                                # tiny random DeepSeek-V3, 2 spawned CPU ranks
    python examples/generate.py --model tiny-glm --pp 2 --temperature 0.8 --top-p 0.9
    torchrun --nproc-per-node 16 examples/generate.py --model /ckpt/DeepSeek-V3.1 --tp 8 --pp 2

``Pipeline`` makes the start-up exchange once and caches plans, so the second prompt pays only its
own prefill; every rank receives the next-token logits and samples the same tokens (seeded).
"""

import argparse

import torch

from vpp.models.registry import open_model
from vpp.parallel import initialize_model_parallel, launch
from vpp.runtime import Pipeline, Sampler


def generate(rank: int, world: int, args) -> None:
    groups = initialize_model_parallel(args.tp, args.pp)
    model = open_model(args.model)
    stages = model.stages(model.layout("v", args.pp), groups)  # a V: 2 stages per rank, even as the model allows
    pipe = Pipeline(stages, groups)
    gen = torch.Generator().manual_seed(0)
    for n, length in enumerate((args.seq_len, args.seq_len // 2)):  # two prompts, one after the other
        prompt = torch.randint(0, model.config["vocab_size"], (length,), generator=gen)
        out = pipe.generate(prompt if any(s.is_first for s in stages) else None, args.max_new_tokens, args.chunk_size,
                            schedule="vpp-async", sampler=Sampler(args.temperature, args.top_k, args.top_p, seed=n))
        if groups.global_rank == 0:  # every rank holds the same tokens; one prints them
            print(f"prompt {n} ({length} tokens): {out.tokens[0]}  [TTFT {out.ttft_s:.3f} s, "
                  f"{1e3 * out.time_per_output_token_s:.1f} ms per output token]")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-deepseek", help="tiny-deepseek | tiny-qwen | tiny-glm | a model directory")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    args = p.parse_args()
    launch(generate, args.tp * args.pp, args)
