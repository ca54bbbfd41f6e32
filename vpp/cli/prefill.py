"""``vpp prefill``: run prefill schedules on real ranks and print one row per schedule, then one line on
why the fastest V schedule beat CPP or did not (its TTFT over CPP's per round, the bubble each left,
and how many layers of the last chunk run alone at the end).

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
import statistics
import sys

from vpp.cli.args import (UsageError, fraction_list, nonnegative_float, nonnegative_int, positive_float,
                          positive_int, writable_file, writable_files_in)
from vpp.cli.checks import check_devices, open_checked
from vpp.cli.memory_check import check_memory, check_positions
from vpp.cli.terminal import progress_bar, setup_logging
from vpp.schedules import strategies
from vpp.schedules.dcpp import DEFAULT_VARIANT, VARIANTS

# The defaults are chosen to show the effect on a quiet 2-core machine in about two minutes (estimated
# from the 12K-token run of benchmarks/results/measured.md: 181 s for 5 rounds of 3 schedules at ~10 s
# each): tiny-deepseek, 8192 random tokens in 4 chunks of 2048, 5 interleaved rounds. With tau_k linear
# in k, the V's gain over CPP is its shorter drain and fill, (tau_{N-1} - tau_0) / 2 of S + tau_{N-1}
# (vpp.schedules.drain_balance), so it is largest at few chunks whose cost grows most with the prefix: the
# cost model gives VPP-Async 0.882 of CPP's makespan at 4 chunks of 2048, 0.903 at 8 of 1024 and 0.937
# at 16 of 1024 (tests/models/test_partition.py checks the order).
DEFAULT_SEQ_LEN = 8192
DEFAULT_CHUNK = 2048
DEFAULT_ROUNDS = 5
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
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel ranks per pipeline stage")
    p.add_argument("--pp", type=positive_int, default=None, help="pipeline ranks (tp * pp ranks in all; default 2, "
                   "1 with --cp)")
    p.add_argument("--cp", type=positive_int, default=1,
                   help="context-parallel ranks: each chunk's tokens split over them, the KV cache sharded "
                        "(tp * cp ranks; see vpp.cli.cp_runs)")
    p.add_argument("--cp-attention", default="auto", choices=("auto", "all-gather", "pass-kv", "pass-q"),
                   help="--cp: how queries meet the other ranks' keys (auto: per chunk, Meta's rule)")
    p.add_argument("--seq-len", type=positive_int, default=None,
                   help=f"prompt tokens (default {DEFAULT_SEQ_LEN} random ids; with --prompt-file the text repeated to this length, "
                        "else the text's own length)")
    p.add_argument("--prompt-file", metavar="FILE",
                   help="a text prompt, tokenized with the model directory's tokenizer.json (pip install -e '.[text]' in a clone)")
    p.add_argument("--chunk-size", type=positive_int, default=DEFAULT_CHUNK,
                   help="tokens per chunk (DCPP: its token budget)")
    p.add_argument("--schedule", default="cpp,vpp,vpp-async",
                   help=f"comma-separated, from: {', '.join(strategies.PLANNED)}")
    p.add_argument("--cached-prefix", type=nonnegative_int, default=0, metavar="N",
                   help="the first N prompt tokens are prefilled untimed first (their caches stay), then the "
                        "rest is timed as a prompt with a cached prefix")
    p.add_argument("--dcpp-mode", default=DEFAULT_VARIANT, choices=VARIANTS,
                   help="--schedule dcpp: the engine (and commit) whose planner to reproduce, see vpp.schedules.dcpp")
    p.add_argument("--dcpp-min-chunk", type=positive_int, default=None,
                   help="--schedule dcpp: floor on a chunk (default: the mode's, e.g. vLLM-Ascend 4096 clamped "
                        "to the budget, which leaves no room to shrink below a 4096-token budget)")
    p.add_argument("--folds", type=positive_int, default=1, help="folds of the V (2*folds stages per rank)")
    p.add_argument("--layout", default=None, choices=("v", "interleaved"),
                   help="the V schedules' layout (vpp, vpp-async, vpp-packed): the fold-back V (default) or "
                        "Megatron's interleaved one (stage i on rank i mod pp, 2 x folds stages per rank)")
    p.add_argument("--taper-head", type=fraction_list, default=(), metavar="FRACTIONS",
                   help="first chunks as fractions of --chunk-size (e.g. 0.25,0.75; rounded to 64 tokens), "
                        "then full chunks (vpp.perf.taper, the tuner's tapered rows)")
    p.add_argument("--taper-tail", type=fraction_list, default=(), metavar="FRACTIONS",
                   help="last chunks as fractions of --chunk-size (e.g. 0.5,0.25,0.25)")
    p.add_argument("--partition", default="rank", choices=("rank", "even"),
                   help="layers per stage: balanced per rank on the cost model (among ties, the fastest for the "
                        "schedule over the whole prompt, simulated), or even")
    p.add_argument("--repeat", type=positive_int, default=DEFAULT_ROUNDS,
                   help="rounds, each running every schedule once, interleaved")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the untimed warm-up run of each schedule (two chunks; with --repeat 1 a short "
                        "prompt of at most 256 tokens, so a long prompt is not computed twice)")
    p.add_argument("--no-pin", action="store_true",
                   help="leave the CPU ranks unpinned (default: CPU rank r runs on core r when there are as "
                        "many cores as ranks)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="auto: a model directory's config torch_dtype, float32 for the built-in models; "
                        "16 bits (bf16) on an accelerator")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and prompt")
    p.add_argument("--moe-dispatch", default="allreduce", choices=("allreduce", "alltoall"),
                   help="how MoE tokens reach their experts across expert-parallel ranks")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per spawned rank")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"),
                   help="one device per rank; auto: this machine's accelerator if it has one, else CPU")
    p.add_argument("--timeout", type=positive_float, default=None,
                   help="seconds before a stuck rank fails the run (also the process group's timeout); default "
                        "1800, or more for long prompts: 8x the cost model's estimate of the planned work "
                        "(vpp.cli.planned_work); a shorter explicit one is warned about")
    p.add_argument("--check", action="store_true", help="compare logits with an unpipelined forward")
    p.add_argument("--atol", type=nonnegative_float, default=None,
                   help="--check tolerance on |logits - reference| (default 1e-3 in float32; in 16 bits 8 ulps of "
                        "the largest reference logit: 2^-4 x max|logit| in bfloat16, 2^-7 x in float16)")
    p.add_argument("--save-logits", metavar="FILE", help="write prompt ids and last-token logits (safetensors)")
    p.add_argument("--trace", metavar="DIR", help="write Chrome traces and PNG timelines")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")


def check(args) -> None:
    """Everything that can be wrong before a rank starts: the schedules, the model directory (config,
    index, safetensors headers, quantization), the split over --tp/--pp/--folds (every stage built
    on the meta device), the prompt file and the output paths."""
    from vpp.models import check_model, open_model, prompt_ids
    args.pp = args.pp or (1 if args.cp > 1 else 2)
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
    if args.cached_prefix >= args.seq_len:
        raise UsageError(f"--cached-prefix {args.cached_prefix} leaves nothing to prefill of a {args.seq_len}-token "
                         f"prompt")
    if args.cp > 1:
        from vpp.cli.cp_runs import check_cp
        check_cp(args, prompt_tokens=args.seq_len, given_options={})
    if args.taper_head or args.taper_tail:
        _check_taper(args)
    if args.cp > 1 and args.pp == 1:  # one CP group of tp x cp ranks: no pipeline schedule to compare
        pipeline_only = {o: "it shapes a pipeline: give --pp 2 or more" for o, v in (("--folds", args.folds != 1),
                         ("--schedule", args.schedule != "cpp,vpp,vpp-async"), ("--trace", args.trace),
                         ("--save-logits", args.save_logits), ("--layout", args.layout),
                         ("--taper-head", args.taper_head), ("--taper-tail", args.taper_tail)) if v}
        for option, why in pipeline_only.items():
            raise UsageError(f"{option} cannot be combined with --cp {args.cp} --pp 1 ({why})")
        _, cp_layouts = open_checked(args.model, tp=args.tp, pp=1, schedules=["cpp"], chunk=args.chunk_size,
                                     seq_len=args.seq_len)
        args.memory_plan = check_memory(model, {"cp": cp_layouts["cpp"]}, tp=args.tp, tokens=args.seq_len,
                                        chunk=args.chunk_size, device=args.device, cp=args.cp)
        check_devices(args.device, args.tp * args.cp)
        _resolve_timeout(args, model, runs=args.repeat)
        return
    _, args.layouts = open_checked(args.model, tp=args.tp, pp=args.pp, schedules=args.schedules, folds=args.folds,
                                   chunk=args.chunk_size, seq_len=args.seq_len, partition=args.partition,
                                   kind=args.layout)
    args.memory_plan = check_memory(model, args.layouts, tp=args.tp, tokens=args.seq_len, chunk=args.chunk_size,
                                    device=args.device, cp=args.cp)
    if args.save_logits:
        writable_file(args.save_logits, "--save-logits")
    if args.trace:
        writable_files_in(args.trace, [s + suffix for s in args.schedules for suffix in TRACE_FILES], "--trace")
    check_devices(args.device, args.tp * args.cp * args.pp)
    _resolve_timeout(args, model, runs=len(args.schedules) * args.repeat)


def _check_taper(args) -> None:
    """Tapered chunks: fixed-chunk schedules only, ramps of whole 64-token pieces within the budget."""
    from vpp.perf.taper import ALIGN
    dcpp = [s for s in args.schedules if strategies.get(s).chunking != "fixed"]
    if dcpp:
        raise UsageError(f"--taper-head/--taper-tail cut fixed chunks; {', '.join(dcpp)} takes its chunk sizes from "
                         f"its planner")
    if args.chunk_size < ALIGN:
        raise UsageError(f"--taper-head/--taper-tail cut --chunk-size {args.chunk_size} into pieces of at least "
                         f"{ALIGN} tokens: give --chunk-size {ALIGN} or more")


def _resolve_timeout(args, model, *, runs: int) -> None:
    """``--timeout`` as given (warned when shorter than the planned work), or grown with it."""
    from vpp.cli.planned_work import timeout_for
    args.timeout = timeout_for(args.timeout, model.config, tokens=args.seq_len, tp=args.tp, runs=runs,
                               device=args.device, command="prefill")


def _config(args):
    from vpp.cli.prefill_rounds import BenchConfig
    return BenchConfig(model=args.model, tp=args.tp, pp=args.pp, seq_len=args.seq_len, chunk_size=args.chunk_size,
                       schedules=args.schedules, folds=args.folds, partition=args.partition, repeat=args.repeat,
                       warmup=not args.no_warmup, dtype=args.run_dtype, seed=args.seed,
                       moe_dispatch=args.moe_dispatch, timeout_s=args.timeout, check=args.check,
                       trace_dir=args.trace, save_logits=args.save_logits, prompt=args.prompt,
                       progress=None if args.no_progress else progress_bar, cached_prefix=args.cached_prefix,
                       dcpp_mode=args.dcpp_mode, dcpp_min_chunk=args.dcpp_min_chunk, layouts=args.layouts,
                       cp=args.cp, cp_attention=args.cp_attention, taper=(args.taper_head, args.taper_tail),
                       pin=not args.no_pin)


def _worker(rank: int, world: int, cfg):
    setup_logging()
    from vpp.parallel import initialize_model_parallel
    from vpp.cli.prefill_rounds import run_bench
    groups = initialize_model_parallel(cfg.tp, cfg.pp, context_parallel_size=cfg.cp)
    rows, facts = run_bench(groups, cfg)
    if groups.global_rank != 0:
        return None
    return rows, facts


def rank_job(args):
    """What every rank of a checked run does: ``(fn, ranks, job)``, each rank calling ``fn(rank, ranks,
    job)``; :func:`finish` reports global rank 0's answer. One CP group (``--cp`` > 1, ``--pp 1``) runs
    :func:`vpp.cli.cp_runs.cp_worker`, a pipeline the schedules (:func:`vpp.cli.prefill_rounds.run_bench`)."""
    if args.cp > 1 and args.pp == 1:
        from vpp.cli.cp_runs import CPJob, cp_worker
        job = CPJob(args.model, args.tp, args.cp, args.chunk_size, args.prompt, args.seq_len, args.cp_attention,
                    args.run_dtype, args.seed, repeat=args.repeat, warmup=not args.no_warmup,
                    cached_prefix=args.cached_prefix, check=args.check, moe_dispatch=args.moe_dispatch)
        return cp_worker, job.tp * job.cp, job
    cfg = _config(args)
    return _worker, cfg.tp * cfg.cp * cfg.pp, cfg


def run(args) -> int:
    from vpp.parallel import launch
    fn, ranks, job = rank_job(args)
    device = None if args.device == "auto" else args.device
    out = launch(fn, ranks, job, timeout=args.timeout * 2, threads=args.threads, pg_timeout_s=args.timeout,
                 device=device, same=args._given)[0]
    if out is None:  # under torchrun, every rank but global rank 0
        return 0
    return finish(args, job, out)


def finish(args, job, out) -> int:
    """Print global rank 0's answer ``out`` to :func:`rank_job`'s ``job``; the exit status (1: --check failed)."""
    if args.cp > 1 and args.pp == 1:
        from vpp.cli.cp_runs import report_prefill
        atol = args.atol if args.atol is not None else check_tolerance(job.dtype, out.get("reference_max_abs", 0.0))
        plan = (getattr(args, "memory_plan", None) or {}).get("cp")
        out["memory_plan"] = plan[0].to_dict() if plan else None  # every rank alike: its share of the KV cache
        return report_prefill(out, job, as_json=args.json, atol=atol)
    rows, facts = out
    atol = args.atol
    if atol is None:
        atol = check_tolerance(job.dtype, facts["check"]["reference_max_abs"] if job.check else 0.0)
    return report(rows, facts, job, as_json=args.json, atol=atol, memory_plan=getattr(args, "memory_plan", None))


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
        out = {"config": {k: v for k, v in vars(cfg).items() if k not in ("progress", "layouts")}, "transfer_s": facts["transfer_s"],
               "layouts": facts["layouts"], "chunks": facts.get("chunks"), "rows": [_row_dict(r) for r in rows], "check": facts.get("check"),
               "atol": atol if cfg.check else None, "memory_method": facts.get("memory_method"),
               "why": why_line(rows, facts), "memory": _memory_json(rows, memory_plan, cfg.tp * cfg.cp)}
        print(json.dumps(out, indent=2, default=str), flush=True)
    else:
        print(_table(rows, facts, cfg), flush=True)
    if cfg.save_logits:  # after the table: the primary results first, a failure here loses nothing measured
        from safetensors.torch import save
        from vpp.safe_write import write_bytes
        tensors = {"input_ids": facts["prompt"].contiguous()}
        tensors.update({f"logits.{s}": t.float().contiguous() for s, t in facts["logits"].items()})
        # serialised here, written beside the target and renamed over it only if it is a regular file
        write_bytes(cfg.save_logits, save(tensors, metadata={"model": cfg.model, "chunk_size": str(cfg.chunk_size)}),
                    option="--save-logits")
        facts.setdefault("written", []).append(cfg.save_logits)
    extra_failed = None
    if facts.get("traces"):  # the extras last: a folder that became unwritable loses no result
        from vpp.cli.prefill_rounds import write_traces
        try:
            facts.setdefault("written", []).extend(write_traces(cfg.trace_dir, facts.pop("traces")))
        except (OSError, ValueError) as exc:
            extra_failed = exc
    if facts.get("written"):
        print("wrote " + ", ".join(facts["written"]), file=sys.stderr)
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
    if extra_failed is not None:  # one line (exit 1), after every result is out
        raise RuntimeError(f"--trace {cfg.trace_dir}: the traces were not written, the results were "
                           f"({type(extra_failed).__name__}: {str(extra_failed).splitlines()[0] if str(extra_failed) else ''})")
    return 1 if failed else 0


def _memory_json(rows, plans: dict | None, per_stage: int = 1) -> dict:
    """Per schedule and global rank: the plan made before the ranks started (vpp.perf.memory_plan, one per
    pipeline rank: every TP and CP rank of a stage plans alike, a CP rank with its share of the KV cache)
    beside the measured peak (rows' memory; on CPU the process's peak RSS, which the plan's "runtime"
    part covers). ``per_stage``: the ranks of one pipeline rank, tp x cp (global rank // per_stage is the
    pipeline rank, vpp.parallel.grid)."""
    out = {}
    for r in rows:
        plan = {p.rank: p.to_dict() for p in (plans or {}).get(r.schedule, [])}
        out[r.schedule] = []
        for m in r.memory:
            mine = plan.get(m["rank"] // per_stage)
            out[r.schedule].append({
                "rank": m["rank"], "pp_rank": m["rank"] // per_stage, "plan": mine,
                "measured_peak_bytes": m.get("peak_bytes"), "measured_weights_bytes": m.get("weights_bytes"),
                "measured_kv_cache_bytes": m.get("kv_cache_bytes"),
                "plan_over_measured": mine["total"] / m["peak_bytes"] if mine and m.get("peak_bytes") else None})
    return out


def why_line(rows, facts) -> str | None:
    """One line on the fastest V schedule against CPP: its TTFT as a fraction of CPP's (per round, then
    the median and range over rounds), the bubble each left (median idle share of the ranks' time),
    and how much of the last chunk runs alone at the end (the drain): the last stage's layers."""
    by = {r.schedule: r for r in rows if r.ttft}
    vs = [r for r in by.values() if strategies.get(r.schedule).layout == "v"]
    if "cpp" not in by or not vs:
        return None
    cpp = by["cpp"]
    best = min(vs, key=lambda r: r.stats("ttft")[0])
    ratios = [t / c for t, c in zip(best.ttft, cpp.ttft)]
    med, lo, hi = statistics.median(ratios), min(ratios), max(ratios)
    label = strategies.get(best.schedule).label
    verdict = "faster" if hi < 1 else "not faster every round" if lo < 1 else "not faster"
    text = f"why {label} is {verdict}: TTFT {med:.3f} x CPP's [{lo:.3f}-{hi:.3f}] (per round)"
    if best.bubble_ratio and cpp.bubble_ratio:
        text += (f"; it left {best.stats('bubble_ratio')[0]:.1%} of the ranks' time idle (bubble) vs CPP's "
                 f"{cpp.stats('bubble_ratio')[0]:.1%}")
    parts = facts.get("partitions", {})
    if best.schedule in parts and "cpp" in parts:
        v_last, cpp_last = parts[best.schedule][-1], parts["cpp"][-1]
        text += (f"; the last chunk ends on one rank alone, {v_last} layer{'s' * (v_last > 1)} (the V's last "
                 f"stage) vs CPP's {cpp_last}")
    return text


def _row_dict(r) -> dict:
    keys = ("ttft", "makespan", "bubble_ratio", "exposed", "speedup", "sim_makespan", "sim_bubble_ratio",
            "overhead_per_action_us")
    out = {"schedule": r.schedule, "max_abs_diff": r.max_abs_diff, "memory": r.memory}
    for k in keys:
        med, lo, hi = r.stats(k)
        out[k] = {"median": med, "min": lo, "max": hi, "values": getattr(r, k)}
    return out


def _table(rows, facts, cfg) -> str:
    cp = f" cp={cfg.cp} ({cfg.cp_attention} attention; the trace shows CP rank 0's pipeline)" if cfg.cp > 1 else ""
    head = (f"model={cfg.model} dtype={cfg.dtype} tp={cfg.tp}{cp} pp={cfg.pp} seq_len={cfg.seq_len} chunk={cfg.chunk_size} "
            f"repeat={cfg.repeat} (median [min-max]); transfer of one chunk {facts['transfer_s'] * 1e3:.2f} ms")
    if cfg.cached_prefix:
        head += f"; the first {cfg.cached_prefix} tokens cached (prefilled untimed), the rest timed"
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
    why = why_line(rows, facts)
    if why:
        lines.append(why)
    if any(r.memory for r in rows):
        lines.append(f"peak memory per rank, MiB ({facts.get('memory_method')}), with its KV cache: " + "; ".join(
            f"{r.schedule} " + " ".join(f"r{m['rank']}={_mib(m)} (KV {m.get('kv_cache_bytes', 0) / 2**20:.1f})"
                                        for m in r.memory) for r in rows))
    if "cpp" in cfg.schedules:
        lines.append("speed-up vs cpp = CPP's TTFT / this schedule's TTFT within each round, median [min-max] over "
                     "rounds (> 1: faster than CPP); bubble % = idle / (ranks x makespan)")
    return "\n".join(lines)


def _mib(m: dict) -> str:
    """Peak allocated MiB, with the allocator's reserved peak after a slash where it differs (devices)."""
    alloc, reserved = m.get("peak_bytes", 0) / 2**20, m.get("peak_reserved_bytes", 0) / 2**20
    return f"{alloc:.0f}" if round(reserved) in (0, round(alloc)) else f"{alloc:.0f}/{reserved:.0f}"


__all__ = [
    "CHECK_RTOL", "DEFAULT_CHUNK", "DEFAULT_ROUNDS", "DEFAULT_SEQ_LEN", "TRACE_FILES", "add_arguments",
    "check", "check_tolerance", "finish", "rank_job", "report", "run", "why_line",
]
