"""Prefill one long prompt through a GLM-5 model (MLA + DSA sparse attention) with VPP.

GLM-5's lightning indexer is shared by groups of layers (``indexer_types``): a layer marked "shared"
reuses the previous layer's top-k selection, so a stage may not begin at it. ``snap_partition`` picks
the most even partition whose stage boundaries respect that.

    python examples/glm_prefill.py                        # tiny random model, 2 spawned CPU ranks
    torchrun --nproc-per-node 2 examples/glm_prefill.py --seq-len 8192
    torchrun --nproc-per-node 16 examples/glm_prefill.py --model /ckpt/GLM-5 --tp 8 --pp 2
"""

import argparse

from vpp.models import prompt_ids
from vpp.models.registry import open_model, snap_partition
from vpp.parallel import initialize_model_parallel, launch
from vpp.runtime import forward_vpp_prefill, make_layout


def prefill(rank: int, world: int, args) -> None:
    groups = initialize_model_parallel(args.tp, args.pp)
    model = open_model(args.model or "tiny-glm", dtype=args.dtype)  # a model directory, or the built-in tiny model
    config = model.config
    partition = snap_partition(model.num_layers, 2 * args.pp, model.stage_starts)
    layout = make_layout("v", model.num_layers, args.pp, partition=partition)
    stages = model.stages(layout, groups)  # this rank's stages: a checkpoint's weights, or random ones

    # random ids, or a text in the checkpoint's own tokenizer (repeated up to --seq-len when given)
    prompt = prompt_ids(args.model or "tiny-glm", config["vocab_size"], args.seq_len, args.prompt_file)
    out = forward_vpp_prefill(stages, prompt if groups.pp.rank == 0 else None, args.chunk_size, groups,
                              return_trace=True)
    if out.logits is not None and groups.tp.rank == 0:
        per_chunk = {}
        for span in out.trace.of(kind="compute"):
            per_chunk[span.chunk] = per_chunk.get(span.chunk, 0.0) + span.duration
        taus = " ".join(f"{per_chunk[k] * 1e3:.0f}" for k in sorted(per_chunk))
        print(f"{layout.describe()}\nfirst generated token: {int(out.logits.argmax())}; "
              f"bubble ratio {out.trace.summarize().bubble_ratio:.1%}; "
              f"compute per chunk (ms, all stages; DSA keeps it from growing linearly): {taus}")
    for stage in stages:
        stage.release(0)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a GLM-5 (glm_moe_dsa) model directory; default: tiny")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--seq-len", type=int, help="prompt tokens (default 4096 random ids, or the text's length)")
    p.add_argument("--prompt-file", help="a text prompt, tokenized with the model directory's tokenizer.json")
    p.add_argument("--dtype", default="auto", help="auto (the checkpoint's torch_dtype) | float32 | bfloat16 | float16")
    p.add_argument("--chunk-size", type=int, default=512)
    args = p.parse_args()
    launch(prefill, args.tp * args.pp, args)
