"""``vpp generate``: prefill a prompt with one schedule, then decode new tokens from the caches the
prefill left, on spawned CPU ranks or under torchrun.

    vpp generate --model tiny-deepseek --pp 2 --schedule vpp-async --max-new-tokens 16
    vpp generate --model /ckpt/DeepSeek-V3.1 --tp 8 --pp 2 --prompt "Hello" --temperature 0.7 --top-p 0.9

The prompt is ``--prompt TEXT`` or ``--prompt-file F`` (tokenised with the checkpoint's tokenizer) or
``--seq-len L`` random token ids (``--seed``). Without ``--json`` the new tokens stream to stdout as
text when the checkpoint has a tokenizer (as ids otherwise); ``--json`` prints one object with
``prompt_ids``, ``generated_ids``, ``text`` (with a tokenizer), ``ttft_s`` and
``time_per_output_token_s``.

Prefill here, decode there: ``--decode-tp T [--decode-pp P]`` prefills on the first ``tp x pp``
ranks with the chosen schedule, hands the request's caches over to the next ``T x P`` ranks (a
loop layout; P defaults to 1) and decodes there (:mod:`vpp.kv.disaggregated`); the JSON then
also has ``handover_s``. ``--save-kv DIR`` prefills, samples the first token and writes the caches
to DIR (:mod:`vpp.kv.files` documents the layout); ``--load-kv DIR`` continues that request
on ``--tp x --cp x --pp`` ranks of any layout (the prompt and the first token come from DIR). With
``--cp C`` the prefill's stages are CP groups and each CP rank hands over or writes only its token
shard; ``--decode-cp C`` (with ``--decode-tp``) or ``--load-kv DIR --cp C`` decodes on CP ranks, each
holding its share of the tokens::

    vpp generate --model DIR --tp 1 --pp 2 --schedule vpp-async --decode-tp 2 --max-new-tokens 12 --json
    vpp generate --model DIR --tp 1 --pp 2 --save-kv kv/ --max-new-tokens 12 --json
    vpp generate --model DIR --tp 2 --pp 1 --load-kv kv/ --max-new-tokens 12 --json
    vpp generate --model DIR --cp 2 --pp 2 --decode-tp 1 --decode-cp 2 --max-new-tokens 12 --json
    vpp generate --model DIR --cp 2 --pp 2 --save-kv kv/ --max-new-tokens 12 --json
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

from vpp.cli.args import (UsageError, nonnegative_float, nonnegative_int, positive_float, positive_int,
                          writable_files_in)
from vpp.cli.checks import open_checked
from vpp.cli.memory_check import check_memory, check_positions
from vpp.cli.terminal import setup_logging
from vpp.schedules import strategies



def add_arguments(p) -> None:
    p.add_argument("--model", default="tiny-deepseek",
                   help="tiny-deepseek | tiny-qwen | tiny-glm | a model directory (config.json + safetensors)")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel ranks per pipeline stage")
    p.add_argument("--pp", type=positive_int, default=None, help="pipeline ranks (tp * pp ranks in all; default 2, "
                   "1 with --cp)")
    p.add_argument("--cp", type=positive_int, default=1,
                   help="context-parallel ranks per stage: the prompt's chunks split over them, the KV cache sharded, "
                        "each decode step merged over their shards (tp * cp * pp ranks; see vpp.cli.cp_runs)")
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
    p.add_argument("--decode-tp", type=positive_int, default=None,
                   help="decode on another TP x PP group of ranks after the prefill (the KV caches are handed over)")
    p.add_argument("--decode-pp", type=positive_int, default=None, help="the decode group's PP (default 1)")
    p.add_argument("--decode-cp", type=positive_int, default=None,
                   help="the decode group's CP: each of its CP ranks receives its share of the tokens (default 1)")
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--save-kv", metavar="DIR", help="prefill, sample the first token, write the caches to DIR, stop")
    kv.add_argument("--load-kv", metavar="DIR",
                    help="continue the request saved in DIR (--tp x --cp x --pp of any layout)")


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
    decode_tp: int | None = None
    decode_pp: int = 1
    decode_cp: int = 1
    save_kv: str | None = None
    load_kv: str | None = None
    first_tokens: list[int] | None = None  # --load-kv: the tokens generated before the caches were saved
    sampler_state: str | None = None  # hex of the sampler's generator state
    cp: int = 1  # context-parallel ranks per stage of the prefill (its pipeline, --pp > 1)
    layout: object = None  # the run's Layout, chosen once by check (vpp.models.run_layout.layout_for; --load-kv: a loop)
    decode_layout: object = None  # --decode-tp: the decode group's loop layout


def check(args) -> None:
    if args.top_p > 1:
        raise UsageError(f"argument --top-p: must lie in (0, 1], got {args.top_p}")
    args.pp = args.pp or (1 if args.cp > 1 else 2)
    schedule = "cpp" if args.load_kv or (args.cp > 1 and args.pp == 1) else args.schedule
    from vpp.models import check_model, text_prompt
    try:
        check_model(args.model, dtype=args.dtype)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    for option, value in (("--decode-pp", args.decode_pp), ("--decode-cp", args.decode_cp)):
        if value is not None and args.decode_tp is None:
            raise UsageError(f"{option} needs --decode-tp (the decode group's TP size)")
    if args.cached_prefix and (args.decode_tp is not None or args.save_kv or args.load_kv):
        raise UsageError("--cached-prefix runs on one group: it cannot be combined with --decode-tp, --save-kv or "
                         "--load-kv")
    if args.decode_tp is not None and (args.save_kv or args.load_kv):
        raise UsageError("--decode-tp hands the caches over between ranks; --save-kv / --load-kv through a directory: "
                         "choose one")
    run_as = schedule  # --load-kv continues on a loop of the tp x pp ranks; CP prefills one group
    model, layouts = open_checked(args.model, tp=args.tp, pp=args.pp, schedules=[run_as])
    decode_layout = None
    if args.decode_tp is not None:
        decode_layout = open_checked(args.model, tp=args.decode_tp, pp=args.decode_pp or 1, schedules=["cpp"])[1]["cpp"]
    args.tokenizer = _tokenizer(args)
    saved = _saved_request(args.load_kv) if args.load_kv else None
    if saved is not None:
        if args.prompt is not None or args.prompt_file is not None or args.seq_len is not None:
            raise UsageError("--load-kv continues the saved prompt: give no --prompt / --prompt-file / --seq-len")
        ids = saved["prompt_ids"]
    elif args.prompt is not None or args.prompt_file is not None:
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
    args.model_dtype = model.dtype
    check_memory(model, layouts, tp=args.tp, cp=args.cp,
                 tokens=len(ids) + args.max_new_tokens, chunk=args.chunk_size,
                 option=f" plus {args.max_new_tokens} new tokens")
    args.job = GenerateJob(args.model, args.tp, args.pp, args.schedule, args.chunk_size, args.max_new_tokens, ids,
                           args.temperature, args.top_k, args.top_p, args.seed, args.dtype, args.timeout,
                           stream=not args.json, eos_token_id=model.config.get("eos_token_id")
                           if isinstance(model.config.get("eos_token_id"), int) else None,
                           cached_prefix=args.cached_prefix,
                           decode_tp=args.decode_tp, decode_pp=args.decode_pp or 1, decode_cp=args.decode_cp or 1,
                           save_kv=args.save_kv,
                           load_kv=args.load_kv, first_tokens=saved["generated"] if saved else None,
                           sampler_state=saved.get("sampler_state") if saved else None,
                           layout=layouts[run_as], decode_layout=decode_layout, cp=args.cp)
    if args.save_kv:
        _check_output_dir(args.save_kv, args.tp * args.cp * args.pp)
    if args.cp > 1:
        from vpp.cli.cp_runs import check_cp
        check_cp(args, prompt_tokens=len(ids), given_options={})


def _saved_request(directory: str) -> dict:
    """The prompt and tokens a --save-kv run recorded in ``directory`` (a UsageError if unreadable)."""
    from vpp.kv.files import read_manifest
    try:
        extra = read_manifest(directory)["extra"]
        return dict(prompt_ids=[int(t) for t in extra["prompt_ids"]], generated=[int(t) for t in extra["generated"]],
                    sampler_state=extra.get("sampler_state"))
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--load-kv {directory}: {exc}") from None


def _check_output_dir(directory: str, ranks: int) -> None:
    import os
    if os.path.exists(os.path.join(directory, "manifest.json")):
        raise UsageError(f"--save-kv {directory}: already holds saved caches (manifest.json); choose an empty directory")
    parent = os.path.dirname(os.path.abspath(directory))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise UsageError(f"--save-kv {directory}: cannot create it in {parent}")
    # what the ranks will write there: no special file, directory or read-only file in the way
    writable_files_in(directory, ["manifest.json"] + [f"rank-{r:05d}.safetensors" for r in range(ranks)], "--save-kv")


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
    if job.decode_tp is not None:
        return _disaggregated_worker(job, has_tokenizer)
    if job.load_kv is not None:
        return _load_worker(job, has_tokenizer)
    import torch

    from vpp.models.registry import open_model
    from vpp.parallel import initialize_model_parallel
    from vpp.runtime import Pipeline, Sampler, profile_planner

    groups = initialize_model_parallel(job.tp, job.pp, context_parallel_size=job.cp)
    model = open_model(job.model, dtype=job.dtype, device_kind=groups.accelerator.kind)
    stages = model.stages(job.layout, groups)
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
    if job.save_kv is not None:
        return _save(pipe, job, ids if holds_first else None, chunking)
    gen = pipe.generate(ids if holds_first else None, job.max_new_tokens, chunking, schedule=job.schedule,
                        sampler=Sampler(job.temperature, job.top_k, job.top_p, job.seed),
                        eos_token_id=job.eos_token_id, on_tokens=show, cached_tokens=job.cached_prefix)
    return gen if groups.global_rank == 0 else None


def _sampler(job: GenerateJob):
    from vpp.runtime import Sampler
    return Sampler(job.temperature, job.top_k, job.top_p, job.seed)


def _show(job: GenerateJob, has_tokenizer: bool, leader: bool):
    if not (job.stream and leader):
        return None
    tokenizer = None
    if has_tokenizer:
        from vpp.models.tokenizer import load_tokenizer
        tokenizer = load_tokenizer(job.model)
    return _streamer(tokenizer)


def _disaggregated_worker(job: GenerateJob, has_tokenizer: bool):
    """Prefill on the first tp x pp ranks, decode on the next decode_tp x decode_pp ranks."""
    import torch

    from vpp.models.registry import open_model
    from vpp.parallel.instances import initialize_disaggregated
    from vpp.runtime import Pipeline, profile_planner
    from vpp.kv.disaggregated import generate_disaggregated

    link = initialize_disaggregated(job.tp, job.pp, job.decode_tp, job.decode_pp, prefill_cp=job.cp,
                                    decode_cp=job.decode_cp)
    model = open_model(job.model, dtype=job.dtype, device_kind=link.groups.accelerator.kind)
    layout = job.layout if link.is_prefill else job.decode_layout
    stages = model.stages(layout, link.groups)
    pipe = Pipeline(stages, link.groups, timeout_s=job.timeout_s)
    chunking = job.chunk_size
    if link.is_prefill and strategies.get(job.schedule).chunking == "dcpp":
        chunking = profile_planner(stages, link.groups, job.chunk_size).chunk_sizes
    leader = link.groups.global_rank == link.decode_ranks[0]
    holds_first = link.is_prefill and any(s.is_first for s in stages)
    ids = torch.tensor(job.prompt_ids, dtype=torch.long)
    gen = generate_disaggregated(pipe, link, ids if holds_first else None, job.max_new_tokens, chunking,
                                 schedule=job.schedule, sampler=_sampler(job), eos_token_id=job.eos_token_id,
                                 on_tokens=_show(job, has_tokenizer, leader))
    return gen if leader else None


def _save(pipe, job: GenerateJob, ids, chunking):
    """Prefill, sample the first token, write the caches to job.save_kv; a Generation of one token."""
    from vpp.runtime import Generation
    from vpp.kv.files import save_cache

    sampler = _sampler(job)
    out = pipe.prefill(ids, chunking, schedule=job.schedule)
    first = [int(sampler.sample(pipe.next_logits(out, [0]))[0])]
    state = bytes(sampler.generator.get_state().tolist()).hex()
    save_cache(pipe, 0, job.save_kv, extra=dict(prompt_ids=job.prompt_ids, generated=first, sampler_state=state,
                                                 model=job.model, schedule=job.schedule))
    return Generation({0: first}, out.wall_s, 0.0, 0) if pipe.groups.global_rank == 0 else None


def _load_worker(job: GenerateJob, has_tokenizer: bool):
    """Continue the request saved in job.load_kv on this job's tp x cp x pp ranks (a loop layout)."""
    import torch

    from vpp.models.registry import open_model
    from vpp.parallel import initialize_model_parallel
    from vpp.runtime import Generation, Pipeline
    from vpp.kv.files import load_cache

    groups = initialize_model_parallel(job.tp, job.pp, context_parallel_size=job.cp)
    model = open_model(job.model, dtype=job.dtype, device_kind=groups.accelerator.kind)
    pipe = Pipeline(model.stages(job.layout, groups), groups, timeout_s=job.timeout_s)
    load_cache(pipe, 0, job.load_kv, reserve=job.max_new_tokens)
    sampler = _sampler(job)
    if job.sampler_state is not None:
        sampler.generator.set_state(torch.tensor(list(bytes.fromhex(job.sampler_state)), dtype=torch.uint8))
    generated = {0: list(job.first_tokens)}
    steps, decode_s = pipe.continue_generation(generated, job.max_new_tokens, sampler, eos_token_id=job.eos_token_id,
                                               on_tokens=_show(job, has_tokenizer, groups.global_rank == 0))
    pipe.release(0)
    return Generation(generated, 0.0, decode_s, steps) if groups.global_rank == 0 else None


def _config(job: GenerateJob) -> dict:
    """The job's settings for the JSON output: the hand-over's only when used (internal ones never)."""
    extra = ("decode_tp", "decode_pp", "save_kv", "load_kv")
    out = {k: v for k, v in asdict(job).items()
           if k not in ("prompt_ids", "first_tokens", "sampler_state", "layout", "decode_layout")}
    if job.decode_tp is None:
        out.pop("decode_pp")
    if job.decode_tp is None or job.decode_cp == 1:
        out.pop("decode_cp")
    if job.cp == 1:
        out.pop("cp")
    return {k: v for k, v in out.items() if k not in extra or v is not None}


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


def _run_cp(args) -> int:
    from vpp.cli.cp_runs import CPJob, launch_job
    job = args.job
    dtype = str(args.model_dtype).removeprefix("torch.")
    out = launch_job(CPJob(job.model, job.tp, args.cp, job.chunk_size, job.prompt_ids, len(job.prompt_ids), "auto",
                           dtype, job.seed, warmup=False, cached_prefix=job.cached_prefix,
                           max_new_tokens=job.max_new_tokens, temperature=job.temperature, top_k=job.top_k,
                           top_p=job.top_p), args)
    if out is None:  # under torchrun, every rank but global rank 0
        return 0
    new = out["generated_ids"]
    if args.json:
        result = {"prompt_ids": job.prompt_ids, "generated_ids": new, "ttft_s": out["ttft_s"][0],
                  "time_per_output_token_s": out["time_per_output_token_s"], "cp": args.cp,
                  "cp_attention": out["methods"], "kv_cache": out["ranks"],
                  "config": {k: v for k, v in _config(job).items() if k != "schedule"}}
        if args.tokenizer is not None:
            result["text"] = args.tokenizer.decode(new)
        print(json.dumps(result))
    else:
        print(args.tokenizer.decode(new) if args.tokenizer is not None else " ".join(map(str, new)), flush=True)
        print(f"[{len(new)} tokens; TTFT {out['ttft_s'][0]:.3f} s, {1e3 * out['time_per_output_token_s']:.1f} ms per "
              f"output token; cp={args.cp}]", file=sys.stderr)
    return 0


def run(args) -> int:
    if args.cp > 1 and args.pp == 1 and args.decode_tp is None and not (args.save_kv or args.load_kv):
        return _run_cp(args)
    from vpp.parallel import launch
    job = args.job
    world = job.tp * job.cp * job.pp + (job.decode_tp * job.decode_cp * job.decode_pp if job.decode_tp else 0)
    values = launch(_worker, world, job, args.tokenizer is not None, timeout=job.timeout_s * 2, threads=args.threads,
                    pg_timeout_s=job.timeout_s, same=args._given)
    gen = next((v for v in values if v is not None), None)
    if gen is None:  # under torchrun, every rank but the one that reports
        return 0
    new = gen.tokens[0]
    if args.json:
        out = {"prompt_ids": job.prompt_ids, "generated_ids": new, "ttft_s": gen.ttft_s,
               "time_per_output_token_s": gen.time_per_output_token_s, "decode_steps": gen.steps,
               "config": _config(job)}
        if job.decode_tp is not None:
            out["handover_s"] = gen.handover_s
        if args.tokenizer is not None:
            out["text"] = args.tokenizer.decode(new)
        print(json.dumps(out))
    else:
        print(flush=True)
        print(f"[{len(new)} tokens; TTFT {gen.ttft_s:.3f} s, {1e3 * gen.time_per_output_token_s:.1f} ms per output "
              f"token]", file=sys.stderr)
    return 0


__all__ = ["GenerateJob", "add_arguments", "check", "run"]
