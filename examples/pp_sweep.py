"""The same prefill with PP = 1, 2, 3, 4 and every layout vpp offers, in one table (the paper reports
PP = 2 only). Every row must agree on the first generated token.

    python examples/pp_sweep.py                          # tiny DeepSeek, spawned CPU ranks
    python examples/pp_sweep.py --model tiny-qwen --seq-len 8192 --chunk-size 1024
    torchrun --nproc-per-node 4 examples/pp_sweep.py     # only PP = world size under torchrun

Timings on a shared 2-core machine are indicative only; use `vpp prefill --repeat` for measurements.
"""

import argparse
import time

import torch.distributed as dist

from vpp.models import prompt_ids
from vpp.models.registry import open_model, snap_partition
from vpp.parallel import initialize_model_parallel, launch, launched_by_torchrun
from vpp.runtime import forward_prefill, make_layout

# (schedule, layout kind, folds)
VARIANTS = [("cpp", "loop", 1), ("vpp", "v", 1), ("vpp-async", "v", 1), ("vpp-async", "v", 2),
            ("vpp-async", "interleaved", 1)]


def sweep(rank: int, world: int, args) -> list[tuple] | None:
    groups = initialize_model_parallel(1, world)
    model = open_model(args.model, dtype=args.dtype)
    prompt = prompt_ids(args.model, model.config.get("vocab_size", 512), args.seq_len, args.prompt_file,
                        default_len=2048)
    rows = []
    for schedule, kind, folds in VARIANTS:
        stages_total = world if kind == "loop" else 2 * folds * world
        why = None
        if world == 1 and kind != "loop" and folds > 1:
            why = "one rank holds every stage: more folds change nothing"
        elif stages_total > model.num_layers:
            why = f"{stages_total} stages but only {model.num_layers} layers"
        else:
            try:
                partition = snap_partition(model.num_layers, stages_total, model.stage_starts)
            except ValueError as exc:
                why = str(exc)
        if why:  # said in the table, never dropped silently
            rows.append((world, schedule, f"{kind} f={folds}", None, None, None, f"skipped: {why}"))
            continue
        layout = make_layout(kind, model.num_layers, world, folds=folds, partition=partition)
        stages = model.stages(layout, groups)
        start = time.perf_counter()
        out = forward_prefill(stages, prompt if 0 in layout.stages_of(groups.pp.rank) else None,
                              args.chunk_size, groups, schedule=schedule, return_trace=True)
        wall = time.perf_counter() - start
        s = out.trace.summarize()
        token = int(out.logits.argmax()) if out.logits is not None else None
        if world > 1:  # the logits live on the rank holding the last stage; share the token
            everyone = [None] * world
            dist.all_gather_object(everyone, token)
            token = next(t for t in everyone if t is not None)
        rows.append((world, schedule, f"{kind} f={folds}", wall, s.makespan, s.bubble_ratio, token))
    return rows if groups.pp.rank == 0 else None


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-deepseek")
    p.add_argument("--seq-len", type=int, help="prompt tokens (default 2048 random ids, or the text's length)")
    p.add_argument("--prompt-file", help="a text prompt, tokenized with the model directory's tokenizer.json")
    p.add_argument("--dtype", default="auto", help="auto (the checkpoint's torch_dtype) | float32 | bfloat16 | float16")
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--pp", default="1,2,3,4", help="comma-separated PP degrees (spawned runs)")
    args = p.parse_args()
    degrees = [None] if launched_by_torchrun() else [int(x) for x in args.pp.split(",")]
    header = ["| PP | schedule | layout | wall s | makespan s | bubble ratio | first token |", "|---|---|---|---|---|---|---|"]
    for pp in degrees:
        results = launch(sweep, pp or 0, args)
        rows = next((r for r in results if r is not None), None)
        if rows is None:  # under torchrun, every rank but pipeline rank 0: that one prints the table
            continue
        if header:
            print(*header, sep="\n")
            header = []
        for world, schedule, layout, wall, makespan, bubble, token in rows:
            if wall is None:
                print(f"| {world} | {schedule} | {layout} | - | - | - | {token} |")
            else:
                print(f"| {world} | {schedule} | {layout} | {wall:.2f} | {makespan:.2f} | {bubble:.1%} | {token} |")
