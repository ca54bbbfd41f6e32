"""Peak memory per rank against prompt length: weights, KV cache and the rest.

    python -m benchmarks.memory [--model tiny-deepseek] [--lengths 4096,8192,16384,32768,65536]
                                [--chunk 1024] [--schedules cpp,vpp-async] [--pp 2] [--workspace BYTES]

Each (schedule, length) runs in a fresh world of ``pp`` spawned ranks (a fresh process, so no earlier
run's freed memory hides in the measurement). Every rank builds only its own stages, runs a short
warm-up prefill (4 chunks, then released: the kernels and library pages a run touches are resident
before the measurement), then measures:

* weights: the bytes of its stages' parameters;
* KV cache: the bytes its stages' caches hold when the prefill ends (reserved once at the prompt
  length: exactly tokens x cached numbers per token);
* peak: on CUDA/NPU the allocator's ``max_memory_allocated`` over the run (tensors only); on CPU the
  process's peak resident set during the run (``VmHWM`` after ``/proc/self/clear_refs``), above the
  resident set just before the run (after ``malloc_trim``), which already holds the interpreter, torch
  and the weights;
* rest = peak - weights - KV cache on devices; on CPU = peak RSS - RSS before the run - KV cache: the
  activations, attention workspace, received and sent hidden states, and allocator slack.

On CPU the ranks run with glibc's mmap threshold fixed at 64 KiB (``MALLOC_MMAP_THRESHOLD_``, and
``MALLOC_TRIM_THRESHOLD_`` at 1 MiB): large tensors then come from mmap and go back to the OS when freed,
so the resident set follows live memory. With glibc's default (a threshold that rises to 32 MiB after
the first large free) freed activations stay resident in the heap and the peak RSS also counts how
fragmented the heap got over the run, which grows with the number of chunks, not with live memory.

The rest should not grow with the prompt: a chunk's activations depend on the chunk size, MLA's
expanded keys and DSA's scores on the workspace budget, and a send buffer lives only while in flight.
Writes ``benchmarks/results/memory.md`` and ``memory.json`` (``--out DIR``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import torch

MIB = 2 ** 20


def _trim() -> None:
    """Hand freed heap memory back to the OS (glibc), so the resident set before a run is what is live."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _rank(rank: int, world: int, model: str, schedule: str, length: int, chunk: int, workspace: int | None) -> dict:
    from vpp.models import build_stage, random_checkpoint
    from vpp.parallel import initialize_model_parallel
    from vpp.transformer.attention.workspace import set_workspace_bytes
    from vpp.runtime.api import forward_prefill
    from vpp.cli.prefill_rounds import cache_bytes, weight_bytes
    groups = initialize_model_parallel(1, world)
    acc, device = groups.accelerator, groups.device
    cfg, layout = _config_layout(model, schedule, world, length)
    weights = random_checkpoint(cfg, 0)
    stages = [build_stage(cfg, layout.stage_layers[s], groups, weights=weights) for s in layout.stages_of(groups.pp.rank)]
    del weights
    for st in stages:
        set_workspace_bytes(st, workspace)
    ids = torch.randint(0, cfg["vocab_size"], (length,), generator=torch.Generator().manual_seed(1))
    holds_first = 0 in layout.stages_of(groups.pp.rank)
    # a short warm-up prefill first (released), so lazily initialised kernels and library pages that a
    # run touches are resident before the measurement starts, whatever the prompt length
    warm = ids[: min(length, 4 * chunk)]
    forward_prefill(stages, warm if holds_first else None, chunk, groups, schedule=schedule, request_ids=[1])
    for st in stages:
        st.release(1)
    _trim()
    before = acc.peak_memory(device) if acc.kind != "cpu" else _rss()
    acc.reset_peak_memory(device)
    start = time.perf_counter()
    out = forward_prefill(stages, ids if holds_first else None, chunk, groups, schedule=schedule,
                          timeout_s=3600.0)
    acc.synchronize(device)
    wall = time.perf_counter() - start
    peak = acc.peak_memory(device)
    kv = sum(cache_bytes(st) for st in stages)
    w = weight_bytes(stages)
    rest = peak - w - kv if acc.kind != "cpu" else peak - before - kv
    return {"rank": rank, "schedule": schedule, "length": length, "weights": w, "kv": kv, "peak": peak,
            "before": before, "rest": rest, "wall_s": wall, "method": acc.peak_memory_method,
            "max_live_sends": out.result.meta.get("max_live_sends")}


def _config_layout(model: str, schedule: str, world: int, length: int):
    from vpp.models import model_config
    from vpp.models.registry import snap_partition
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.schedules import make_layout, strategies
    cfg = model_config(dict(TINY_CONFIGS[model], max_position_embeddings=max(length, 32768)))
    n = cfg["num_hidden_layers"]
    kind = strategies.get(schedule).layout
    stages_n = world * (1 if kind == "loop" else 2)
    layout = make_layout(kind, n, world, partition=snap_partition(n, stages_n, tuple(
        i for i in range(n) if cfg.get("indexer_types") is None or cfg["indexer_types"][i] != "shared")))
    return cfg, layout


def _plan(model: str, schedule: str, world: int, length: int, chunk: int, workspace: int | None) -> list:
    """The plan ``vpp prefill`` checks before starting ranks (vpp.perf.memory_plan), for this cell."""
    from types import SimpleNamespace
    from vpp.cli.memory_check import plan_ranks
    from vpp.perf.memory_plan import CPU_WORKSPACE
    cfg, layout = _config_layout(model, schedule, world, length)
    plans = plan_ranks(SimpleNamespace(config=cfg, dtype=torch.float32), layout, tp=1, tokens=length, chunk=chunk,
                       device="cpu")
    if workspace is not None:  # the ranks ran with another attention budget
        from dataclasses import replace
        plans = [replace(p, activations=p.activations - CPU_WORKSPACE + workspace) for p in plans]
    return plans


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def markdown(rows: list[dict], args, load: tuple) -> str:
    method = rows[0]["method"] if rows else "-"
    lines = ["# Peak memory per rank against prompt length", "",
             f"`python -m benchmarks.memory {' '.join(sys.argv[1:])}` -- {args.model}, pp={args.pp}, "
             f"{args.chunk}-token chunks, fp32, one run per cell (a fresh pair of processes each), "
             f"workspace budget {'the default' if args.workspace is None else f'{args.workspace} B'}; "
             f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}.", "",
             f"Peak: {method}. On CPU, 'rest' = peak RSS during the run - RSS just before it - KV cache; the RSS "
             "before the run (interpreter, torch, weights) is shown as 'before'; glibc with "
             f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_')} (freed tensors leave the resident "
             "set). MiB.", "",
             "Plan: what `vpp prefill` checks against the available memory before starting any rank "
             "(vpp.perf.memory_plan: weights and KV cache from the meta-built stages and the config, activations = "
             "attention workspace + one layer's working set + 2 chunk outputs in flight, runtime = the resident set "
             "of the planning process, which imported torch as a rank does); plan/peak compares it with the "
             "measured peak.", "",
             "| schedule | tokens | rank | weights | KV cache | rest | before | peak | plan | plan act. | plan/peak | KV per token (B) | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['schedule']} | {r['length']} | {r['rank']} | {r['weights'] / MIB:.1f} | {r['kv'] / MIB:.1f} | "
                     f"{r['rest'] / MIB:.1f} | {r['before'] / MIB:.1f} | {r['peak'] / MIB:.1f} | "
                     f"{r['plan']['total'] / MIB:.1f} | {r['plan']['activations'] / MIB:.1f} | {r['plan_over_peak']:.3f} | "
                     f"{r['kv'] / r['length']:.0f} | {r['wall_s']:.0f} |")
    ratios = sorted(r["plan_over_peak"] for r in rows)
    if ratios:
        lines += ["", f"plan / measured peak over {len(ratios)} rank-cells: median {ratios[len(ratios) // 2]:.3f}, "
                      f"min {ratios[0]:.3f}, max {ratios[-1]:.3f}; largest |error| "
                      f"{100 * max(abs(x - 1) for x in ratios):.1f}%"]
    by = {}
    for r in rows:
        by.setdefault((r["schedule"], r["rank"]), []).append(r)
    lines += ["", "Rest, smallest to largest prompt (MiB), and how much the KV cache grew over the same range:", ""]
    for (sched, rank), rs in sorted(by.items()):
        rs.sort(key=lambda r: r["length"])
        rests = " / ".join(f"{r['rest'] / MIB:.0f}" for r in rs)
        lines.append(f"- {sched} rank {rank}: rest {rests}; KV {rs[0]['kv'] / MIB:.0f} -> {rs[-1]['kv'] / MIB:.0f}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-deepseek")
    p.add_argument("--lengths", default="4096,8192,16384,32768,65536")
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--schedules", default="cpp,vpp-async")
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--workspace", type=int, default=None, help="attention workspace budget in bytes")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--quick", action="store_true", help="a smoke run: 1K tokens, 256-token chunks, cpp only")
    args = p.parse_args(argv)
    if args.quick:
        args.lengths, args.chunk, args.schedules = "1024", 256, "cpp"
    from vpp.parallel import run_distributed
    # read by glibc when each spawned rank starts (see the module docstring)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", "1048576")
    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        for schedule in args.schedules.split(","):  # interleaved per length
            got = run_distributed(_rank, args.pp, args.model, schedule, length, args.chunk, args.workspace,
                                  timeout=7200.0)
            plans = _plan(args.model, schedule, args.pp, length, args.chunk, args.workspace)
            for r in got:
                p = plans[r["rank"]]
                r.update(plan=p.to_dict(), plan_over_peak=p.total / r["peak"] if r["peak"] else None)
            rows += got
            for r in got:
                print(f"{schedule} {length} rank {r['rank']}: weights {r['weights'] / MIB:.1f} kv {r['kv'] / MIB:.1f} "
                      f"rest {r['rest'] / MIB:.1f} peak {r['peak'] / MIB:.1f} MiB, plan {r['plan']['total'] / MIB:.1f} "
                      f"({r['wall_s']:.0f} s)", flush=True)
    text = markdown(rows, args, os.getloadavg())
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        from vpp.safe_write import write_text
        write_text(os.path.join(args.out, "memory.md"), text)
        write_text(os.path.join(args.out, "memory.json"), json.dumps({"command": sys.argv, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
