"""Prefill one long prompt through a Qwen3-MoE (GQA) model, CPP and VPP side by side.

The same weights are cut two ways: a plain pipeline (one stage per rank, CPP) and a V (two stages
per rank, VPP). Both must produce the same first token.

    python examples/qwen_prefill.py                      # tiny random model, 2 spawned CPU ranks
    python examples/qwen_prefill.py --tp 2 --pp 2        # 4 ranks: GQA heads and experts over TP
    torchrun --nproc-per-node 16 examples/qwen_prefill.py --model /ckpt/Qwen3-Coder-30B-A3B-Instruct --tp 8
"""

import argparse

from vpp.models import prompt_ids
from vpp.models.registry import open_model
from vpp.parallel import initialize_model_parallel, launch
from vpp.runtime import forward_cpp_prefill, forward_vpp_prefill, make_layout


def prefill(rank: int, world: int, args) -> None:
    groups = initialize_model_parallel(args.tp, args.pp, args.ep)
    model = open_model(args.model or "tiny-qwen", dtype=args.dtype)  # a model directory, or the built-in tiny model
    config = model.config

    # random ids, or a text in the checkpoint's own tokenizer (repeated up to --seq-len when given)
    prompt = prompt_ids(args.model or "tiny-qwen", config["vocab_size"], args.seq_len, args.prompt_file)
    first = {}
    for name, kind, run in (("cpp", "loop", forward_cpp_prefill), ("vpp", "v", forward_vpp_prefill)):
        stages = model.stages(make_layout(kind, model.num_layers, args.pp), groups)
        holds_first = any(s.is_first for s in stages)
        out = run(stages, prompt if holds_first else None, args.chunk_size, groups, return_trace=True)
        if out.logits is not None and groups.tp.rank == 0:
            first[name] = int(out.logits.argmax())
            summary = out.trace.summarize()
            print(f"{name}: first token {first[name]}, makespan {summary.makespan:.2f} s, "
                  f"bubble ratio {summary.bubble_ratio:.1%}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a Qwen3-MoE model directory; default: tiny")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--ep", type=int, default=1, help="expert-parallel size (divides tp)")
    p.add_argument("--seq-len", type=int, help="prompt tokens (default 4096 random ids, or the text's length)")
    p.add_argument("--prompt-file", help="a text prompt, tokenized with the model directory's tokenizer.json")
    p.add_argument("--dtype", default="auto", help="auto (the checkpoint's torch_dtype) | float32 | bfloat16 | float16")
    p.add_argument("--chunk-size", type=int, default=512)
    args = p.parse_args()
    launch(prefill, args.tp * args.pp, args)
