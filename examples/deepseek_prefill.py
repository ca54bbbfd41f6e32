"""Prefill one long prompt through a DeepSeek-V3 (MLA) model with VPP-Async.

The model is cut into 2*pp virtual stages folded back over the pipeline ranks (a V): rank 0 holds the
first and the last stage, so the prompt goes in and the logits come out on rank 0.

    python examples/deepseek_prefill.py                       # tiny random model, 2 spawned CPU ranks
    torchrun --nproc-per-node 2 examples/deepseek_prefill.py  # the same under torchrun
    torchrun --nproc-per-node 16 examples/deepseek_prefill.py --model /ckpt/DeepSeek-V3.1 --tp 8 --pp 2
"""

import argparse

from vpp.models import prompt_ids
from vpp.models.registry import open_model
from vpp.parallel import initialize_model_parallel, launch
from vpp.runtime import forward_vpp_prefill, make_layout


def prefill(rank: int, world: int, args) -> None:
    groups = initialize_model_parallel(args.tp, args.pp)
    model = open_model(args.model or "tiny-deepseek", dtype=args.dtype)  # a model directory, or the built-in tiny model
    config = model.config
    layout = make_layout("v", model.num_layers, args.pp)
    stages = model.stages(layout, groups)  # this rank's stages: a checkpoint's weights, or random ones

    # random ids, or a text in the checkpoint's own tokenizer (repeated up to --seq-len when given)
    prompt = prompt_ids(args.model or "tiny-deepseek", config["vocab_size"], args.seq_len, args.prompt_file)
    out = forward_vpp_prefill(stages, prompt if groups.pp.rank == 0 else None, args.chunk_size, groups,
                              async_comm=True, return_trace=True)
    if out.logits is not None and groups.tp.rank == 0:
        summary = out.trace.summarize()
        print(f"{layout.describe()}\nfirst generated token: {int(out.logits.argmax())}; "
              f"makespan {summary.makespan:.2f} s, bubble ratio {summary.bubble_ratio:.1%}")
    # The KV caches of request 0 stay in the stages for decoding; free them when done.
    for stage in stages:
        stage.release(0)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a DeepSeek-V3 model directory (config.json + safetensors); default: tiny")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--seq-len", type=int, help="prompt tokens (default 4096 random ids, or the text's length)")
    p.add_argument("--prompt-file", help="a text prompt, tokenized with the model directory's tokenizer.json")
    p.add_argument("--dtype", default="auto", help="auto (the checkpoint's torch_dtype) | float32 | bfloat16 | float16")
    p.add_argument("--chunk-size", type=int, default=512)
    args = p.parse_args()
    launch(prefill, args.tp * args.pp, args)
