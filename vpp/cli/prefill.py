"""``vpp prefill``: run prefill schedules on real ranks and print one row per schedule.

Without torchrun it spawns ``tp * pp`` ranks on this machine: one accelerator each where it has enough
(NCCL/HCCL), else CPU ranks (gloo, one thread each by default); ``--device`` chooses. Under torchrun
(any number of nodes) every launched process is a rank. ``--check`` compares every schedule's
last-token logits with a single-process unpipelined forward of the same weights and exits 1 on a
mismatch.

A model directory is checked in this (parent) process before any rank starts
(:func:`vpp.models.check_model`: config, index, safetensors headers, quantization); a directory vpp
cannot load, or a text prompt without a tokenizer, ends here with ``vpp prefill: error: <one line>``
and exit status 2. ``--dtype auto`` runs a model directory in its config's ``torch_dtype``.
"""

from __future__ import annotations

import json
import math
import sys

from vpp.cli.args import (UsageError, nonnegative_float, positive_float, positive_int, writable_file,
                          writable_files_in)
from vpp.cli.checks import check_devices, open_checked
from vpp.cli.memory_check import check_memory, check_positions
from vpp.cli.output import progress_bar, setup_logging
from vpp.plan import strategies

DEFAULT_SEQ_LEN = 8192
# --check tolerance. The pipelined run and the unpipelined reference compute the same products in
# another order (chunked attention against a cached prefix, TP partial sums). In float32 logits then
# differ by ~1e-6: 1e-3 is absolute. In 16-bit dtypes every activation is rounded to 8 (bf16) or 11
# (fp16) significant bits, so two summation orders differ by a few units in the last place (ulp) of
# the logits: one ulp of the largest logit L is <= 2^-7 L (bf16) or 2^-10 L (fp16). The default
# allows 8 ulps of the reference's largest |logit| (the tiny FP8 checkpoints at TP 2 x PP 2 in
# bf16 differ by 2 ulps); a wrong stage, layout or shard moves logits by O(L). (An MoE router or DSA
# indexer whose top-k flips on a rounding can exceed it in 16 bits: compare in float32 then.)
TRACE_FILES = (".trace.json", ".chrome.json", ".simulated.chrome.json", ".png", ".simulated.png")  # per schedule
CHECK_RTOL = {"bfloat16": 8 * 2.0 ** -7, "float16": 8 * 2.0 ** -10}


def check_tolerance(dtype: str, reference_max_abs: float) -> float:
    """Default --check tolerance on |logits - reference| (see above)."""
    return 1e-3 if dtype == "float32" else CHECK_RTOL[dtype] * reference_max_abs


def add_arguments(p) -> None:
    p.add_argument("--model", default="tiny-deepseek",
                   help="tiny-deepseek | tiny-qwen | tiny-glm | toy | a model directory (config.json + safetensors)")
    p.add_argument("--tp", type=positive_int, default=1)
    p.add_argument("--pp", type=positive_int, default=2)
    p.add_argument("--seq-len", type=positive_int, default=None,
                   help="prompt tokens (default 8192 random ids; with --prompt-file the text repeated to this length, "
                        "else the text's own length)")
    p.add_argument("--prompt-file", metavar="FILE",
                   help="a text prompt, tokenized with the model directory's tokenizer.json (pip install vpp-prefill[text])")
    p.add_argument("--chunk-size", type=positive_int, default=1024)
    p.add_argument("--schedule", default="cpp,vpp,vpp-async",
                   help=f"comma-separated, from: {', '.join(strategies.PLANNED)}")
    p.add_argument("--folds", type=positive_int, default=1, help="folds of the V (2*folds stages per rank)")
    p.add_argument("--partition", default="rank", choices=("rank", "even"),
                   help="layers per stage: balanced per rank on the cost model, or even")
    p.add_argument("--repeat", type=positive_int, default=3)
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="auto: a model directory's config torch_dtype, float32 for the built-in models")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--moe-dispatch", default="allreduce", choices=("allreduce", "alltoall"))
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per spawned rank")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"),
                   help="one device per rank; auto: this machine's accelerator if it has one, else CPU")
    p.add_argument("--timeout", type=positive_float, default=1800.0,
                   help="seconds before a stuck rank fails the run (also the process group's timeout)")
    p.add_argument("--check", action="store_true", help="compare logits with an unpipelined forward")
    p.add_argument("--atol", type=nonnegative_float, default=None,
                   help="--check tolerance on |logits - reference| (default 1e-3 in float32; in 16 bits 8 ulps of "
                        "the largest reference logit: 2^-4 x max|logit| in bfloat16, 2^-7 x in float16)")
    p.add_argument("--save-logits", metavar="FILE", help="write prompt ids and last-token logits (safetensors)")
    p.add_argument("--trace", metavar="DIR", help="write Chrome traces and PNG timelines")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--no-progress", action="store_true")


def check(args) -> None:
    """Everything that can be wrong before a rank starts: the schedules, the model directory (config,
    index, safetensors headers, quantization), the split over --tp/--pp/--folds (every stage built
    on the meta device), the prompt file and the output paths."""
    from vpp.models import check_model, open_model, prompt_ids
    try:
        args.schedules = strategies.parse(args.schedule, strategies.PLANNED)
    except ValueError as exc:
        raise UsageError(f"--schedule: {exc}") from None
    try:
        check_model(args.model, dtype=args.dtype)
        model = open_model(args.model, dtype=args.dtype)  # the config only: no weights are read here
        args.run_dtype = str(model.dtype).removeprefix("torch.")
        args.prompt = None
        if args.seq_len is not None:  # before building any prompt: a billion tokens fail here, at once
            check_positions(model.config, args.seq_len, f"--seq-len {args.seq_len}")
        if args.prompt_file is not None:
            args.prompt = prompt_ids(args.model, model.config.get("vocab_size"), args.seq_len, args.prompt_file).tolist()
    except (ValueError, OSError, ImportError) as exc:
        raise UsageError(str(exc)) from None
    args.seq_len = len(args.prompt) if args.prompt is not None else args.seq_len or DEFAULT_SEQ_LEN
    what = f"the prompt of --prompt-file {args.prompt_file}" if args.prompt is not None else f"--seq-len {args.seq_len}"
    check_positions(model.config, args.seq_len, what)
    checked = open_checked(args.model, tp=args.tp, pp=args.pp, schedules=args.schedules, folds=args.folds,
                           chunk=args.chunk_size, seq_len=args.seq_len, partition=args.partition)
    from vpp.bench.prefill import layout_for
    layouts = {s: layout_for(checked, s, args.pp, args.folds, chunk=args.chunk_size, seq_len=args.seq_len,
                             partition=args.partition) for s in args.schedules}
    args.memory_plan = check_memory(model, layouts, tp=args.tp, tokens=args.seq_len, chunk=args.chunk_size,
                                    device=args.device)
    if args.save_logits:
        writable_file(args.save_logits, "--save-logits")
    if args.trace:
        writable_files_in(args.trace, [s + suffix for s in args.schedules for suffix in TRACE_FILES], "--trace")
    check_devices(args.device, args.tp * args.pp)


def _config(args):
    from vpp.bench.prefill import BenchConfig
    return BenchConfig(model=args.model, tp=args.tp, pp=args.pp, seq_len=args.seq_len, chunk_size=args.chunk_size,
                       schedules=args.schedules, folds=args.folds, partition=args.partition, repeat=args.repeat,
                       warmup=not args.no_warmup, dtype=args.run_dtype, seed=args.seed,
                       moe_dispatch=args.moe_dispatch, timeout_s=args.timeout, check=args.check,
                       trace_dir=args.trace, save_logits=args.save_logits, prompt=args.prompt,
                       progress=None if args.no_progress else progress_bar)


def _worker(rank: int, world: int, cfg):
    setup_logging()
    from vpp.parallel import initialize_model_parallel
    from vpp.bench.prefill import run_bench
    groups = initialize_model_parallel(cfg.tp, cfg.pp)
    rows, facts = run_bench(groups, cfg)
    if groups.global_rank != 0:
        return None
    return rows, facts


def run(args) -> int:
    cfg = _config(args)
    from vpp.parallel import launch
    device = None if args.device == "auto" else args.device
    out = launch(_worker, cfg.tp * cfg.pp, cfg, timeout=cfg.timeout_s * 2, threads=args.threads,
                 pg_timeout_s=cfg.timeout_s, device=device)[0]
    if out is None:  # under torchrun, every rank but global rank 0
        return 0
    rows, facts = out
    atol = args.atol
    if atol is None:
        atol = check_tolerance(cfg.dtype, facts["check"]["reference_max_abs"] if cfg.check else 0.0)
    return report(rows, facts, cfg, as_json=args.json, atol=atol, memory_plan=getattr(args, "memory_plan", None))


def _fmt(stats, scale=1.0, digits=3) -> str:
    med, lo, hi = stats
    if math.isnan(med):
        return "-"
    return f"{med * scale:.{digits}f} [{lo * scale:.{digits}f}-{hi * scale:.{digits}f}]"


def report(rows, facts, cfg, *, as_json: bool, atol: float, memory_plan: dict | None = None) -> int:
    failed = []
    if cfg.check:
        # "not <=": a NaN difference (NaN or Inf on either side) fails, it never passes
        failed = [r.schedule for r in rows if r.max_abs_diff is None or not r.max_abs_diff <= atol]
    if as_json:
        out = {"config": {k: v for k, v in vars(cfg).items() if k != "progress"}, "transfer_s": facts["transfer_s"],
               "layouts": facts["layouts"], "rows": [_row_dict(r) for r in rows], "check": facts.get("check"),
               "atol": atol if cfg.check else None, "memory_method": facts.get("memory_method"),
               "memory": _memory_json(rows, memory_plan)}
        print(json.dumps(out, indent=2, default=str), flush=True)
    else:
        print(_table(rows, facts, cfg), flush=True)
    if cfg.save_logits:  # after the results are out: a failure here loses nothing measured
        from safetensors.torch import save
        from vpp.safe_write import write_bytes
        tensors = {"input_ids": facts["prompt"].contiguous()}
        tensors.update({f"logits.{s}": t.float().contiguous() for s, t in facts["logits"].items()})
        # serialised here, written beside the target and renamed over it only if it is a regular file
        write_bytes(cfg.save_logits, save(tensors, metadata={"model": cfg.model, "chunk_size": str(cfg.chunk_size)}),
                    option="--save-logits")
    if failed:
        hint = ""
        if cfg.dtype in CHECK_RTOL:
            hint = (f" (in {cfg.dtype} a top-k of the MoE router or the DSA indexer can flip on a rounding difference "
                    f"and move logits by O(1); --dtype float32 checks the pipeline to 1e-3)")
        bad_ref = facts["check"].get("reference_nonfinite")
        if bad_ref:
            print(f"CHECK FAILED: {bad_ref}; the schedules {failed} cannot pass", file=sys.stderr)
        else:
            print(f"CHECK FAILED: logits of {failed} differ from the unpipelined reference by more than "
                  f"atol={atol}: {facts['check']}{hint}", file=sys.stderr)
        return 1
    return 0


def _memory_json(rows, plans: dict | None) -> dict:
    """Per schedule and rank: the plan made before the ranks started (vpp.perf.memory_plan) beside the
    measured peak (rows' memory; on CPU the process's peak RSS, which the plan's "runtime" part covers)."""
    out = {}
    for r in rows:
        plan = {p.rank: p.to_dict() for p in (plans or {}).get(r.schedule, [])}
        out[r.schedule] = [{"rank": m["rank"], "plan": plan.get(m["rank"]), "measured_peak_bytes": m.get("peak_bytes"),
                            "measured_weights_bytes": m.get("weights_bytes"),
                            "measured_kv_cache_bytes": m.get("kv_cache_bytes"),
                            "plan_over_measured": (plan[m["rank"]]["total"] / m["peak_bytes"]
                                                   if m["rank"] in plan and m.get("peak_bytes") else None)}
                           for m in r.memory]
    return out


def _row_dict(r) -> dict:
    keys = ("ttft", "makespan", "bubble_ratio", "exposed", "speedup", "sim_makespan", "sim_bubble_ratio",
            "overhead_per_action_us")
    out = {"schedule": r.schedule, "max_abs_diff": r.max_abs_diff, "memory": r.memory}
    for k in keys:
        med, lo, hi = r.stats(k)
        out[k] = {"median": med, "min": lo, "max": hi, "values": getattr(r, k)}
    return out


def _table(rows, facts, cfg) -> str:
    head = (f"model={cfg.model} dtype={cfg.dtype} tp={cfg.tp} pp={cfg.pp} seq_len={cfg.seq_len} chunk={cfg.chunk_size} "
            f"repeat={cfg.repeat} (median [min-max]); transfer of one chunk {facts['transfer_s'] * 1e3:.2f} ms")
    cols = ["schedule", "TTFT s", "makespan s", "bubble %", "exposed comm s", "speed-up vs cpp",
            "sim makespan s", "sim bubble %", "overhead us/action"]
    if cfg.check:
        cols.append("max |dlogit|")
    lines = [head, "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r.schedule, _fmt(r.stats("ttft")), _fmt(r.stats("makespan")), _fmt(r.stats("bubble_ratio"), 100, 1),
                 _fmt(r.stats("exposed")), _fmt(r.stats("speedup"), digits=3), _fmt(r.stats("sim_makespan")),
                 _fmt(r.stats("sim_bubble_ratio"), 100, 1), _fmt(r.stats("overhead_per_action_us"), digits=0)]
        if cfg.check:
            cells.append(f"{r.max_abs_diff:.2e}" if r.max_abs_diff is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    if any(r.memory for r in rows):
        lines.append(f"peak memory per rank, MiB ({facts.get('memory_method')}): " + "; ".join(
            f"{r.schedule} " + " ".join(f"r{m['rank']}={m.get('peak_bytes', 0) / 2**20:.0f}" for m in r.memory)
            for r in rows))
    return "\n".join(lines)
