"""``vpp prefill --cp N`` and ``vpp generate --cp N``: one prompt's chunks split over N context-parallel
ranks, each a TP group of ``--tp`` ranks (``tp x cp`` ranks in all; under torchrun ``--nproc-per-node``
= tp x cp). Every rank holds the whole model and the K/V of its own share of the tokens
(:mod:`vpp.transformer.attention.context_parallel`); ``--cp-attention`` chooses how queries meet
the other ranks' keys (auto: per chunk, Meta's rule). With ``--pp`` > 1 the pipeline engine runs
instead (:mod:`vpp.cli.prefill_rounds`: every stage on a CP group; ``tp x cp x pp`` ranks);
:func:`check_cp` refuses every impossible combination before any rank starts, either way.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass

from vpp.cli.args import UsageError

CP_ATTENTION = ("auto", "all-gather", "pass-kv", "pass-q")


def check_cp(args, *, prompt_tokens: int, given_options: dict) -> None:
    """One line for each impossible CP combination, before any rank starts."""
    cp = args.cp
    if args.model == "toy":
        raise UsageError(f"--cp {cp} needs a transformer (tiny-deepseek, tiny-qwen, tiny-glm or a model "
                         f"directory); the toy model has no attention to split")
    for option, why in given_options.items():
        raise UsageError(f"{option} cannot be combined with --cp {cp} ({why})")
    new = prompt_tokens - getattr(args, "cached_prefix", 0)
    if new < 2 * cp:
        raise UsageError(f"--cp {cp} splits each chunk into 2 * cp = {2 * cp} pieces, more than the {new} tokens "
                         f"to prefill")
    if args.chunk_size < 2 * cp:
        raise UsageError(f"--chunk-size {args.chunk_size} is smaller than 2 * cp = {2 * cp} pieces: some CP ranks "
                         f"would get no tokens")


@dataclass
class CPJob:
    model: str
    tp: int
    cp: int
    chunk_size: int
    prompt: list[int] | None
    seq_len: int
    method: str
    dtype: str
    seed: int
    repeat: int = 1
    warmup: bool = True
    cached_prefix: int = 0
    check: bool = False
    max_new_tokens: int = 0
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    moe_dispatch: str = "allreduce"


def _prompt(job: CPJob, vocab: int):
    import torch
    if job.prompt is not None:
        return torch.tensor(job.prompt, dtype=torch.long)
    return torch.randint(0, vocab, (job.seq_len,), generator=torch.Generator().manual_seed(job.seed + 1))


def _prefill(stage, ids, request, chunk: int, start: int, device):
    out = None
    for s in range(start, len(ids), chunk):
        out = stage(ids[s:s + chunk].to(device), request, s, last_token_only=True)
    return out


def cp_worker(rank: int, world: int, job: CPJob):
    """One CP rank: build the whole model, prefill (rounds, timed), optionally decode; rank 0 reports."""
    import torch
    import torch.distributed as dist
    from vpp.cli.prefill_rounds import warmup_tokens
    from vpp.cli.terminal import setup_logging
    from vpp.models.registry import open_model
    from vpp.parallel import ParallelGroups, initialize_model_parallel
    from vpp.runtime.sampling import Sampler
    setup_logging()
    groups = initialize_model_parallel(job.tp, context_parallel_size=job.cp)
    model = open_model(job.model, dtype=job.dtype, seed=job.seed, moe_dispatch=job.moe_dispatch,
                       device_kind=groups.accelerator.kind)
    stage = model.build((0, model.num_layers), groups)
    stage.cp_method = job.method
    ids = _prompt(job, int(model.config.get("vocab_size", 512)))
    acc, device = groups.accelerator, groups.device
    ttft, kv_bytes, methods, logits = [], 0, [], None
    for r in range(int(job.warmup) + job.repeat):
        request, warm = f"round-{r}", r < int(job.warmup)
        # the warm-up is as short as the pipeline's (prefill_rounds.warmup_tokens): communicators and
        # allocators warmed, the long prompt not computed twice
        prompt = ids[:warmup_tokens(job)] if warm else ids
        cached = 0 if warm else job.cached_prefix
        stage.reserve(request, len(prompt) + job.max_new_tokens)
        if cached:
            _prefill(stage, prompt[:cached], request, job.chunk_size, 0, device)
        start = len(stage.cp_trace)
        dist.barrier()
        acc.synchronize(device)
        t0 = time.perf_counter()
        logits = _prefill(stage, prompt, request, job.chunk_size, cached, device)
        acc.synchronize(device)
        if not warm:
            ttft.append(time.perf_counter() - t0)
        methods = [t[3] for t in stage.cp_trace[start:]]
        kv_bytes = stage.cache_nbytes(request)
        kv_rows = stage._caches()[0].length(request)
        if r < int(job.warmup) + job.repeat - 1 or not job.max_new_tokens:
            stage.release(request)
    new, decode_s = [], 0.0
    if job.max_new_tokens:
        sampler = Sampler(job.temperature, job.top_k, job.top_p, job.seed)
        new = [int(sampler.sample(logits.float())[0])]
        t0 = time.perf_counter()
        for _ in range(job.max_new_tokens - 1):
            step = stage.decode(torch.tensor(new[-1:], device=device), [request])
            new.append(int(sampler.sample(step.float())[0]))
        decode_s = time.perf_counter() - t0
    per_rank = [None] * world
    dist.all_gather_object(per_rank, {"rank": groups.global_rank, "cp_rank": groups.cp.rank,
                                      "kv_cache_bytes": kv_bytes, "kv_rows": kv_rows})
    if groups.global_rank != 0:
        return None
    out = {"ttft_s": ttft, "methods": methods, "ranks": per_rank, "generated_ids": new,
           "time_per_output_token_s": decode_s / max(1, len(new) - 1)}
    if job.check:
        ref_stage = model.build((0, model.num_layers), ParallelGroups.single(acc, device))
        ref = ref_stage(ids.to(device), "reference", 0, last_token_only=True)[-1].float().cpu()
        out["max_abs_diff"] = float((logits[-1].float().cpu() - ref).abs().max())
        out["reference_max_abs"] = float(ref.abs().max())
    return out


def launch_job(job: CPJob, args) -> dict | None:
    from vpp.parallel import launch
    device = None if getattr(args, "device", "auto") == "auto" else args.device
    return launch(cp_worker, job.tp * job.cp, job, timeout=args.timeout * 2, threads=args.threads,
                  pg_timeout_s=args.timeout, device=device, same=args._given)[0]


def report_prefill(out: dict, job: CPJob, *, as_json: bool, atol: float) -> int:
    failed = job.check and not out["max_abs_diff"] <= atol
    if as_json:
        print(json.dumps({"config": vars(job) | {"prompt": None}, **out, "atol": atol if job.check else None},
                         indent=2), flush=True)
    else:
        t = out["ttft_s"]
        counts = {m: out["methods"].count(m) for m in dict.fromkeys(out["methods"])}
        print(f"model={job.model} dtype={job.dtype} tp={job.tp} cp={job.cp} seq_len={job.seq_len} "
              f"chunk={job.chunk_size} repeat={job.repeat}", flush=True)
        print(f"TTFT {statistics.median(t):.3f} s [{min(t):.3f}-{max(t):.3f}]; attention per chunk: "
              + ", ".join(f"{m} x{n}" for m, n in counts.items()), flush=True)
        print("KV cache per rank (its own tokens only): " + "; ".join(
            f"r{p['rank']} {p['kv_rows']} tokens {p['kv_cache_bytes'] / 2**20:.2f} MiB" for p in out["ranks"]))
        if job.check:
            print(f"max |dlogit| vs the unsplit forward: {out['max_abs_diff']:.2e}", flush=True)
    if failed:
        print(f"CHECK FAILED: CP logits differ from the unsplit forward by {out['max_abs_diff']:.2e} > atol={atol}",
              file=sys.stderr)
        return 1
    return 0


__all__ = ["CP_ATTENTION", "CPJob", "check_cp", "cp_worker", "launch_job", "report_prefill"]
