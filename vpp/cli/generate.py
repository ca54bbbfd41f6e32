"""``vpp generate``: prefill a prompt with one schedule, then decode new tokens from the caches the
prefill left, on spawned CPU ranks or under torchrun.

    vpp generate --model tiny-deepseek --pp 2 --schedule vpp-async --max-new-tokens 16
    vpp generate --model /ckpt/DeepSeek-V3.1 --tp 8 --pp 2 --prompt "Hello" --temperature 0.7 --top-p 0.9

The prompt is ``--prompt TEXT`` or ``--prompt-file F`` (tokenised with the checkpoint's tokenizer) or
``--seq-len L`` random token ids (``--seed``). Without ``--json`` the new tokens stream to stdout as
text when the checkpoint has a tokenizer (as ids otherwise); ``--json`` prints one object with
``prompt_ids``, ``generated_ids``, ``text`` (with a tokenizer), ``ttft_s`` and
``time_per_output_token_s``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

from vpp.cli.args import (UsageError, nonnegative_float, nonnegative_int, positive_float, positive_int)
from vpp.cli.checks import open_checked
from vpp.cli.memory_check import check_memory, check_positions
from vpp.cli.terminal import setup_logging
from vpp.plan import strategies



def add_arguments(p) -> None:
    p.add_argument("--model", default="tiny-deepseek",
                   help="tiny-deepseek | tiny-qwen | tiny-glm | a model directory (config.json + safetensors)")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel ranks per pipeline stage")
    p.add_argument("--pp", type=positive_int, default=2, help="pipeline ranks (tp * pp ranks in all)")
    p.add_argument("--schedule", default="vpp-async", choices=strategies.PLANNED, help="the prefill's schedule")
    p.add_argument("--chunk-size", type=positive_int, default=512, help="prefill chunk size (DCPP: its budget)")
    p.add_argument("--max-new-tokens", type=positive_int, default=32, help="tokens to generate after the prompt")
    p.add_argument("--cached-prefix", type=nonnegative_int, default=0, metavar="N",
                   help="prefill the first N prompt tokens first (untimed), then the rest as a prompt with a "
                        "cached prefix; the TTFT covers the rest")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="the prompt as text (needs the checkpoint's tokenizer)")
    source.add_argument("--prompt-file", help="a file holding the prompt text")
    source.add_argument("--seq-len", type=positive_int, help="a prompt of this many random token ids (default 128)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt and of sampling")
    p.add_argument("--temperature", type=nonnegative_float, default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=nonnegative_int, default=0, help="keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=positive_float, default=1.0, help="keep the smallest set of this mass (1: all)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="auto: the checkpoint's torch_dtype (float32 for the built-in tiny models on CPU, bf16 on an accelerator)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per spawned rank")
    p.add_argument("--timeout", type=positive_float, default=600.0,
                   help="seconds before a stuck rank fails the run (also the process group's timeout)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")


@dataclass
class GenerateJob:
    model: str
    tp: int
    pp: int
    schedule: str
    chunk_size: int
    max_new_tokens: int
    prompt_ids: list[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    dtype: str
    timeout_s: float
    stream: bool
    eos_token_id: int | None
    cached_prefix: int = 0


def check(args) -> None:
    if args.top_p > 1:
        raise UsageError(f"argument --top-p: must lie in (0, 1], got {args.top_p}")
    from vpp.models import check_model, text_prompt
    try:
        check_model(args.model, dtype=args.dtype)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    model = open_checked(args.model, tp=args.tp, pp=args.pp, schedules=[args.schedule])
    args.tokenizer = _tokenizer(args)
    if args.prompt is not None or args.prompt_file is not None:
        text = args.prompt if args.prompt is not None else _read(args.prompt_file)
        if not text.strip():  # a tokenizer would still give its BOS: a one-token prompt nobody asked for
            option = "--prompt" if args.prompt is not None else f"--prompt-file {args.prompt_file}"
            raise UsageError(f"{option}: the prompt is empty ({len(text)} characters, no text)")
        try:
            ids = text_prompt(args.tokenizer, text, vocab_size=int(model.config["vocab_size"])).tolist()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    else:
        import torch
        if args.seq_len is not None:  # before building the prompt
            check_positions(model.config, args.seq_len + args.max_new_tokens,
                            f"--seq-len {args.seq_len} plus --max-new-tokens {args.max_new_tokens}")
        vocab = int(model.config["vocab_size"])
        ids = torch.randint(0, vocab, (args.seq_len or 128,), generator=torch.Generator().manual_seed(args.seed)).tolist()
    if args.cached_prefix >= len(ids):
        raise UsageError(f"--cached-prefix {args.cached_prefix} leaves nothing to prefill of a {len(ids)}-token prompt")
    limit = model.config.get("max_position_embeddings")
    if limit is not None and len(ids) + args.max_new_tokens > limit:
        raise UsageError(f"a prompt of {len(ids)} tokens plus --max-new-tokens {args.max_new_tokens} exceeds the "
                         f"model's {limit} positions")
    from vpp.bench.prefill_rounds import layout_for
    check_memory(model, {args.schedule: layout_for(model, args.schedule, args.pp)}, tp=args.tp,
                 tokens=len(ids) + args.max_new_tokens, chunk=args.chunk_size,
                 option=f" plus {args.max_new_tokens} new tokens")
    args.job = GenerateJob(args.model, args.tp, args.pp, args.schedule, args.chunk_size, args.max_new_tokens, ids,
                           args.temperature, args.top_k, args.top_p, args.seed, args.dtype, args.timeout,
                           stream=not args.json, eos_token_id=model.config.get("eos_token_id")
                           if isinstance(model.config.get("eos_token_id"), int) else None,
                           cached_prefix=args.cached_prefix)


def _tokenizer(args):
    """The checkpoint's tokenizer, or None; a text prompt without one is a UsageError."""
    import os
    wants_text = args.prompt is not None or args.prompt_file is not None
    has_file = os.path.isdir(args.model) and os.path.isfile(os.path.join(args.model, "tokenizer.json"))
    if not has_file:
        if wants_text:
            flag = "--prompt" if args.prompt is not None else "--prompt-file"
            raise UsageError(f"{flag} needs a tokenizer, and {args.model} has no tokenizer.json "
                             f"(give --seq-len for random token ids)")
        return None
    from vpp.models.tokenizer import load_tokenizer
    try:
        return load_tokenizer(args.model)
    except (ImportError, ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--prompt-file {path}: {exc}") from None


def _worker(rank: int, world: int, job: GenerateJob, has_tokenizer: bool):
    setup_logging()
    import torch

    from vpp.models.registry import open_model
    from vpp.parallel import initialize_model_parallel
    from vpp.runtime import Pipeline, Sampler, profile_planner

    groups = initialize_model_parallel(job.tp, job.pp)
    model = open_model(job.model, dtype=job.dtype, device_kind=groups.accelerator.kind)
    stages = model.stages(model.layout_for(job.schedule, job.pp), groups)
    pipe = Pipeline(stages, groups, timeout_s=job.timeout_s)
    chunking = job.chunk_size
    if strategies.get(job.schedule).chunking == "dcpp":
        chunking = profile_planner(stages, groups, job.chunk_size).chunk_sizes
    show = None
    if job.stream and groups.global_rank == 0:
        tokenizer = None
        if has_tokenizer:
            from vpp.models.tokenizer import load_tokenizer
            tokenizer = load_tokenizer(job.model)
        show = _streamer(tokenizer)
    holds_first = any(s.is_first for s in stages)
    ids = torch.tensor(job.prompt_ids, dtype=torch.long)
    if job.cached_prefix:  # the prefix's caches stay in the stages under request 0, the id generate uses
        pipe.prefill(ids[:job.cached_prefix] if holds_first else None, chunking, schedule=job.schedule,
                     decode_room=len(job.prompt_ids) - job.cached_prefix + job.max_new_tokens - 1)
    gen = pipe.generate(ids if holds_first else None, job.max_new_tokens, chunking, schedule=job.schedule,
                        sampler=Sampler(job.temperature, job.top_k, job.top_p, job.seed),
                        eos_token_id=job.eos_token_id, on_tokens=show, cached_tokens=job.cached_prefix)
    return gen if groups.global_rank == 0 else None


def _streamer(tokenizer):
    printed: list[int] = []

    def show(tokens: dict) -> None:
        new = tokens[0]
        if tokenizer is None:
            print(" ".join(str(t) for t in new[len(printed):]), end=" ", flush=True)
        else:  # decode the whole text and print what is new (tokens may merge into one character)
            before = tokenizer.decode(printed)
            print(tokenizer.decode(new)[len(before):], end="", flush=True)
        printed[:] = new
    return show


def run(args) -> int:
    from vpp.parallel import launch
    job = args.job
    gen = launch(_worker, job.tp * job.pp, job, args.tokenizer is not None, timeout=job.timeout_s * 2, threads=args.threads,
                 pg_timeout_s=job.timeout_s)[0]
    if gen is None:  # under torchrun, every rank but global rank 0
        return 0
    new = gen.tokens[0]
    if args.json:
        out = {"prompt_ids": job.prompt_ids, "generated_ids": new, "ttft_s": gen.ttft_s,
               "time_per_output_token_s": gen.time_per_output_token_s, "decode_steps": gen.steps,
               "config": {k: v for k, v in asdict(job).items() if k != "prompt_ids"}}
        if args.tokenizer is not None:
            out["text"] = args.tokenizer.decode(new)
        print(json.dumps(out))
    else:
        print(flush=True)
        print(f"[{len(new)} tokens; TTFT {gen.ttft_s:.3f} s, {1e3 * gen.time_per_output_token_s:.1f} ms per output "
              f"token]", file=sys.stderr)
    return 0
