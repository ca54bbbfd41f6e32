"""``vpp prefill``: run prefill schedules on real ranks and print one row per schedule.

Without torchrun it spawns ``tp * pp`` ranks on this machine: one accelerator each where it has enough
(NCCL/HCCL), else CPU ranks (gloo, one thread each by default); ``--device`` chooses. Under torchrun
(any number of nodes) every launched process is a rank. ``--check`` compares every schedule's
last-token logits with a single-process unpipelined forward of the same weights and exits 1 on a
mismatch.
"""

from __future__ import annotations

import json
import math
import sys

from vpp.cli.output import progress_bar, setup_logging
from vpp.plan import strategies



def add_arguments(p) -> None:
    p.add_argument("--model", default="tiny-deepseek",
                   help="tiny-deepseek | tiny-qwen | tiny-glm | toy | a model directory (config.json + safetensors)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--chunk-size", type=int, default=1024)
    p.add_argument("--schedule", default="cpp,vpp,vpp-async",
                   help=f"comma-separated, from: {', '.join(strategies.PLANNED)}")
    p.add_argument("--folds", type=int, default=1, help="folds of the V (2*folds stages per rank)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--moe-dispatch", default="allreduce", choices=("allreduce", "alltoall"))
    p.add_argument("--threads", type=int, default=1, help="torch threads per spawned rank")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"),
                   help="one device per rank; auto: this machine's accelerator if it has one, else CPU")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before a stuck run fails")
    p.add_argument("--check", action="store_true", help="compare logits with an unpipelined forward")
    p.add_argument("--atol", type=float, default=1e-3, help="--check tolerance on logits")
    p.add_argument("--save-logits", metavar="FILE", help="write prompt ids and last-token logits (safetensors)")
    p.add_argument("--trace", metavar="DIR", help="write Chrome traces and PNG timelines")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--no-progress", action="store_true")


def _config(args):
    from vpp.bench.prefill import BenchConfig
    try:
        schedules = strategies.parse(args.schedule, strategies.PLANNED)
    except ValueError as exc:
        raise SystemExit(f"vpp prefill: error: --schedule: {exc}") from None
    for name in ("tp", "pp", "seq_len", "chunk_size", "repeat", "folds"):
        if getattr(args, name) < 1:
            raise SystemExit(f"vpp prefill: --{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    return BenchConfig(model=args.model, tp=args.tp, pp=args.pp, seq_len=args.seq_len, chunk_size=args.chunk_size,
                       schedules=schedules, folds=args.folds, repeat=args.repeat, warmup=not args.no_warmup,
                       dtype=args.dtype, seed=args.seed, moe_dispatch=args.moe_dispatch, timeout_s=args.timeout,
                       check=args.check, trace_dir=args.trace, save_logits=args.save_logits,
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
    out = launch(_worker, cfg.tp * cfg.pp, cfg, timeout=cfg.timeout_s * 2, threads=args.threads, device=device)[0]
    if out is None:  # under torchrun, every rank but global rank 0
        return 0
    rows, facts = out
    return report(rows, facts, cfg, as_json=args.json, atol=args.atol)


def _fmt(stats, scale=1.0, digits=3) -> str:
    med, lo, hi = stats
    if math.isnan(med):
        return "-"
    return f"{med * scale:.{digits}f} [{lo * scale:.{digits}f}-{hi * scale:.{digits}f}]"


def report(rows, facts, cfg, *, as_json: bool, atol: float) -> int:
    failed = []
    if cfg.check:
        failed = [r.schedule for r in rows if r.max_abs_diff is None or r.max_abs_diff > atol]
    if cfg.save_logits:
        from safetensors.torch import save_file
        tensors = {"input_ids": facts["prompt"].contiguous()}
        tensors.update({f"logits.{s}": t.float().contiguous() for s, t in facts["logits"].items()})
        save_file(tensors, cfg.save_logits, metadata={"model": cfg.model, "chunk_size": str(cfg.chunk_size)})
    if as_json:
        out = {"config": {k: v for k, v in vars(cfg).items()}, "transfer_s": facts["transfer_s"],
               "layouts": facts["layouts"], "rows": [_row_dict(r) for r in rows], "check": facts.get("check"),
               "memory_method": facts.get("memory_method")}
        print(json.dumps(out, indent=2, default=str))
    else:
        print(_table(rows, facts, cfg))
    if failed:
        print(f"CHECK FAILED: logits of {failed} differ from the unpipelined reference by more than "
              f"atol={atol}: {facts['check']}", file=sys.stderr)
        return 1
    return 0


def _row_dict(r) -> dict:
    keys = ("ttft", "makespan", "bubble_ratio", "exposed", "speedup", "sim_makespan", "sim_bubble_ratio",
            "overhead_per_action_us")
    out = {"schedule": r.schedule, "max_abs_diff": r.max_abs_diff, "memory": r.memory}
    for k in keys:
        med, lo, hi = r.stats(k)
        out[k] = {"median": med, "min": lo, "max": hi, "values": getattr(r, k)}
    return out


def _table(rows, facts, cfg) -> str:
    head = (f"model={cfg.model} tp={cfg.tp} pp={cfg.pp} seq_len={cfg.seq_len} chunk={cfg.chunk_size} "
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
