"""``vpp serve-bench``: prefill a request stream (the paper's long / mixed / short workloads, scaled
to this machine) on real ranks under CPP, DCPP, VPP, VPP-Async, VPP-Async + packing and
torch.distributed.pipelining's GPipe; one row each, median [min-max] over repeats."""

from __future__ import annotations

import json
import math

from vpp.cli.args import UsageError, check_workload_options, int_list, positive_float, positive_int
from vpp.cli.checks import open_checked
from vpp.cli.memory_check import check_memory, check_positions
from vpp.cli.terminal import setup_logging
from vpp.schedules import strategies
from vpp.schedules.dcpp import DEFAULT_VARIANT, VARIANTS


def add_arguments(p) -> None:
    p.add_argument("--model", default="tiny-deepseek", help="tiny-deepseek | tiny-qwen | tiny-glm | toy | a model directory")
    p.add_argument("--pp", type=positive_int, default=2, help="pipeline ranks")
    p.add_argument("--workload", default="long", choices=("long", "mixed", "short"),
                   help="the paper's request streams (Sec. 6.1), scaled down")
    p.add_argument("--scale", type=positive_float, default=64, help="paper token counts are divided by this")
    # --requests: under torchrun `--n` is refused as an abbreviation of torchrun's own --nnodes / --nproc-per-node
    p.add_argument("--n", "--requests", dest="n", type=positive_int, metavar="N",
                   help="number of requests (mixed: 24, short: 12)")
    p.add_argument("--concurrency", type=positive_int, help="requests in flight (long: 1, mixed: 4, short: all)")
    p.add_argument("--lengths", type=int_list, help="long workload: comma-separated paper-scale lengths (default 64K..1M)")
    p.add_argument("--chunk-size", type=positive_int, default=512, help="tokens per chunk (DCPP: its token budget)")
    p.add_argument("--contenders", default=",".join(strategies.CONTENDERS), help="comma-separated strategies to run")
    p.add_argument("--repeat", type=positive_int, default=3, help="rounds; each runs every contender once, interleaved")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, prompts and arrivals")
    p.add_argument("--timeout", type=positive_float, default=1800.0,
                   help="seconds before a stuck rank fails the run (also the process group's timeout)")
    p.add_argument("--dcpp-mode", default=DEFAULT_VARIANT, choices=VARIANTS,
                   help="DCPP planner: the engine (and commit) it reproduces, see vpp.schedules.dcpp")
    p.add_argument("--dcpp-min-chunk", type=positive_int, default=None,
                   help="DCPP floor on a chunk (default: the mode's, e.g. vLLM-Ascend 4096 clamped to the budget)")
    p.add_argument("--shared-budget", action="store_true",
                   help="one token budget per step shared by the requests (vLLM's batch): a request's tail and "
                        "the next one's first chunk fill a step together")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def check(args) -> None:
    from vpp.cli.stream_rounds import StreamConfig, make_workload
    try:
        contenders = strategies.parse(args.contenders, strategies.CONTENDERS)
    except ValueError as exc:
        raise UsageError(f"--contenders: {exc}") from None
    check_workload_options(args.workload, {"--n": (args.n, ("mixed", "short")), "--lengths": (args.lengths, ("long",))})
    args.cfg = StreamConfig(model=args.model, pp=args.pp, workload=args.workload, scale=args.scale, n=args.n,
                            concurrency=args.concurrency, lengths=args.lengths, chunk_size=args.chunk_size,
                            contenders=contenders, repeat=args.repeat, seed=args.seed, timeout_s=args.timeout,
                            dcpp_mode=args.dcpp_mode, dcpp_min_chunk=args.dcpp_min_chunk,
                            shared_budget=args.shared_budget)
    lengths = make_workload(args.cfg).lengths
    if "gpipe" in contenders and any(n % args.chunk_size for n in lengths):
        raise UsageError(f"--contenders gpipe needs prompt lengths that are multiples of --chunk-size "
                         f"{args.chunk_size}; the {args.workload} workload has {sorted(set(lengths))[:6]} "
                         f"(drop gpipe or change --chunk-size / --scale)")
    schedules = [c for c in contenders if strategies.get(c).builder is not None] or ["cpp"]  # those with a builder
    model, layouts = open_checked(args.model, tp=1, pp=args.pp, schedules=list(dict.fromkeys(contenders + tuple(schedules))))
    check_positions(model.config, max(lengths), f"the longest prompt of the {args.workload} workload")
    check_memory(model, {s: layouts[s] for s in schedules}, tp=1, tokens=max(lengths), chunk=args.chunk_size)
    args.cfg.layouts = {c: layouts[c] for c in contenders}


def _worker(rank, world, cfg):
    setup_logging()
    from vpp.parallel import initialize_model_parallel
    from vpp.cli.stream_rounds import run_stream_bench
    groups = initialize_model_parallel(1, cfg.pp)
    out = run_stream_bench(groups, cfg)
    return out if groups.global_rank == 0 else None


def run(args) -> int:
    from vpp.parallel import launch
    cfg = args.cfg
    out = launch(_worker, cfg.pp, cfg, timeout=cfg.timeout_s * 2, pg_timeout_s=cfg.timeout_s,
                 same=args._given)[0]
    if out is None:
        return 0
    rows, facts = out
    if args.json:
        print(json.dumps({"config": {k: v for k, v in vars(cfg).items() if k != "layouts"}, "facts": facts,
                          "rows": [{k: v for k, v in vars(r).items()} for r in rows]}, indent=2, default=str))
    else:
        print(format_rows(rows, facts, cfg))
    return 0


def _fmt(stats, scale=1.0, digits=2) -> str:
    med, lo, hi = stats
    return "-" if math.isnan(med) else f"{med * scale:.{digits}f} [{lo * scale:.{digits}f}-{hi * scale:.{digits}f}]"


def format_rows(rows, facts, cfg) -> str:
    head = (f"{cfg.model}, pp={cfg.pp}, workload {facts['workload']} (scale 1/{cfg.scale:g}): "
            f"{len(facts['lengths'])} requests, {sum(facts['lengths'])} tokens, concurrency {facts['concurrency']}, "
            f"chunk {cfg.chunk_size}; median [min-max] of {cfg.repeat} interleaved rounds")
    if cfg.shared_budget:
        head += "; one token budget per step shared by the requests"
    cols = ["strategy", "makespan s", "throughput tok/s", "TTFT median s", "TTFT p90 s", "bubble %", "speed-up vs cpp",
            "trace makespan s", "simulated replay s"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join([r.name, _fmt(r.stats("makespan")), _fmt(r.stats("throughput"), digits=0),
                                        _fmt(r.stats("ttft_median")), _fmt(r.stats("ttft_p90")),
                                        _fmt(r.stats("bubble_ratio"), 100, 1), _fmt(r.stats("speedup"), digits=3),
                                        _fmt(r.stats("trace_makespan")), _fmt(r.stats("sim_makespan"))]) + " |")
    return "\n".join(lines)


__all__ = ["add_arguments", "check", "format_rows", "run"]
