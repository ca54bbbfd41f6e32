"""Measure request streams on real ranks: the engine behind ``vpp serve-bench`` (and
``benchmarks/measured.py``, which runs that command).

Contenders (one row each): ``cpp``, ``dcpp`` (vLLM-Ascend's planner profiled on the real stage 0),
``vpp``, ``vpp-async``, ``vpp-packed`` (VPP-Async + pipelined packing) and ``gpipe``
(torch.distributed.pipelining's ``ScheduleGPipe.eval`` on the same stage modules, chunks as
micro-batches, requests one after another; equal chunks only, so prompt lengths must be multiples of
the chunk size). Rounds interleave the contenders (A B C ... A B C ...). Per run: makespan (barrier to
the last first-token), throughput, per-request TTFT (from admission, see :mod:`vpp.schedules.stream`)
and, for vpp's own schedules, the bubble ratio of the executed trace.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from vpp.models.registry import open_model
from vpp.models.run_layout import layout_for
from vpp.parallel.groups import ParallelGroups
from vpp.cli.prefill_rounds import gather_all, measure_transfer, replay, say
from vpp.perf.memory_plan import planned_chunk
from vpp.schedules import strategies, stream_stats, workloads
from vpp.runtime.api import forward_prefill
from vpp.runtime.dcpp_profile import profile_planner
from vpp.runtime.layout_inference import check_agrees
from vpp.schedules.shared_budget import shared_budget_stream
from vpp.runtime.gpipe import gpipe_prefill

CONTENDERS = strategies.CONTENDERS


@dataclass
class StreamConfig:
    model: str = "tiny-deepseek"
    pp: int = 2
    workload: str = "long"
    scale: float = 64
    n: int | None = None
    concurrency: int | None = None
    lengths: tuple[int, ...] | None = None  # paper-scale lengths for "long"
    chunk_size: int = 512
    contenders: tuple[str, ...] = CONTENDERS
    repeat: int = 3
    seed: int = 0
    timeout_s: float = 1800.0
    dcpp_mode: str = "vllm-ascend"       # a vpp.schedules.dcpp.VARIANTS mode
    dcpp_min_chunk: int | None = None    # None: the mode's own floor
    shared_budget: bool = False          # one token budget per step shared by the requests (vpp/schedules/shared_budget.py)
    layouts: dict | None = None          # contender -> layout, chosen once by the command (run_layout.layout_for)


@dataclass
class MeasuredStream:
    name: str
    makespan: list[float] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)
    ttft_median: list[float] = field(default_factory=list)
    ttft_p90: list[float] = field(default_factory=list)
    bubble_ratio: list[float] = field(default_factory=list)
    speedup: list[float] = field(default_factory=list)
    # the executed trace's makespan and the simulator's replay of the same plan with the measured per-chunk
    # compute times and the measured transfer time (the replay error is their gap)
    trace_makespan: list[float] = field(default_factory=list)
    sim_makespan: list[float] = field(default_factory=list)

    def stats(self, key: str) -> tuple[float, float, float]:
        v = getattr(self, key)
        return (statistics.median(v), min(v), max(v)) if v else (float("nan"),) * 3


def make_workload(cfg: StreamConfig) -> workloads.Workload:
    if cfg.workload == "long":
        kw = {"lengths": cfg.lengths} if cfg.lengths else {}
        return workloads.long(cfg.scale, concurrency=cfg.concurrency or 1, **kw)
    if cfg.workload == "mixed":
        return workloads.mixed(cfg.scale, cfg.seed, n=cfg.n or 24, concurrency=cfg.concurrency or 4)
    if cfg.workload == "short":
        n = cfg.n or 12
        return workloads.short(cfg.scale, cfg.seed, n=n, concurrency=cfg.concurrency or n)
    raise ValueError(f"unknown workload {cfg.workload!r}; choose long, mixed or short")


def run_stream_bench(groups: ParallelGroups, cfg: StreamConfig) -> tuple[list[MeasuredStream], dict]:
    """Every contender ``cfg.repeat`` times on the workload, interleaved; rows on every rank."""
    if groups.accelerator.kind == "cpu" and groups.sizes.world_size <= (os.cpu_count() or 1):
        os.sched_setaffinity(0, {groups.global_rank % (os.cpu_count() or 1)})
    wl = make_workload(cfg)
    model = open_model(cfg.model, seed=cfg.seed)
    vocab = int(model.config.get("vocab_size", 512))
    gen = torch.Generator().manual_seed(cfg.seed + 7)
    prompts = [torch.randint(0, vocab, (n,), generator=gen) for n in wl.lengths]
    if "gpipe" in cfg.contenders and any(n % cfg.chunk_size for n in wl.lengths):
        raise ValueError(f"gpipe needs prompt lengths that are multiples of chunk_size={cfg.chunk_size}; "
                         f"workload {wl.name} has {sorted(set(wl.lengths))[:6]}")
    layouts = cfg.layouts or {name: layout_for(model, name, groups.pp.size) for name in cfg.contenders}
    stages = {name: model.stages(layouts[name], groups) for name in cfg.contenders}
    chunk = planned_chunk(cfg.chunk_size, max(wl.lengths))  # chunk-sized buffers no larger than a prompt
    dcpp = next((n for n in cfg.contenders if strategies.get(n).chunking == "dcpp"), None)
    planner = profile_planner(stages[dcpp], groups, chunk, variant=cfg.dcpp_mode,
                              min_chunk=cfg.dcpp_min_chunk) if dcpp is not None else None
    transfer_s = measure_transfer(groups, chunk, stages[cfg.contenders[0]][0].hidden_size,
                                  stages[cfg.contenders[0]][0].dtype)
    rows = {c: MeasuredStream(c) for c in cfg.contenders}
    say(groups, f"stream: {wl.name}, {len(wl.lengths)} requests, {sum(wl.lengths)} tokens, concurrency "
                 f"{wl.concurrency}, chunk {cfg.chunk_size}, pp={groups.pp.size}")
    _run_round(groups, cfg, stages, planner, [p[: cfg.chunk_size] for p in prompts[:2]], None, transfer_s, layouts, warmup=True)
    for r in range(cfg.repeat):
        results = _run_round(groups, cfg, stages, planner, prompts, wl, transfer_s, layouts, warmup=False)
        for name, res in results.items():
            row = rows[name]
            for key, value in res.items():
                getattr(row, key).append(value)
            if "cpp" in results:
                row.speedup.append(results["cpp"]["makespan"] / res["makespan"])
        say(groups, f"  round {r + 1}/{cfg.repeat}: " + ", ".join(f"{n} {v['makespan']:.2f}s" for n, v in results.items()))
    facts = {"workload": wl.name, "lengths": list(wl.lengths), "concurrency": wl.concurrency,
             "dcpp_chunks": {n: planner.chunk_sizes(n) for n in sorted(set(wl.lengths))} if planner else None}
    return [rows[c] for c in cfg.contenders], facts


def _chunking(cfg, name, planner, prompts, concurrency=None):
    """A contender's chunking and steps: fixed, the DCPP planner's, or (``shared_budget``) explicit
    chunk lists whose pieces fill one token budget per step across the requests, with those steps
    (each moved as one message per hop, :mod:`vpp.schedules.steps`)."""
    dcpp = planner if strategies.get(name).chunking == "dcpp" else None
    if cfg.shared_budget:
        lengths = [int(p.numel()) for p in prompts]
        requests, steps = shared_budget_stream(lengths, cfg.chunk_size, planner=dcpp, concurrency=concurrency)
        return [list(q.chunk_sizes) for q in requests], steps
    return (dcpp.chunk_sizes if dcpp is not None else cfg.chunk_size), None


def _run_round(groups, cfg, stages, planner, prompts, wl, transfer_s, layouts, *, warmup: bool) -> dict:
    out = {}
    arrivals = list(wl.arrivals) if wl else None
    concurrency = wl.concurrency if wl else None
    for name in cfg.contenders:
        mine = stages[name]
        holds_first = any(s.is_first for s in mine)
        dist.barrier()
        start = time.perf_counter()
        if strategies.get(name).builder is None:  # gpipe: PyTorch schedules it
            for q, p in enumerate(prompts):
                gpipe_prefill(mine[0], p if holds_first else None, min(cfg.chunk_size, p.numel()), p.numel(),
                              groups, request=q)
            groups.accelerator.synchronize(groups.device)  # the makespan ends when the logits exist
            makespan = max(gather_all(groups, time.perf_counter() - start))
            stats, bubble = None, None
        else:
            chunking, steps = _chunking(cfg, name, planner, prompts, concurrency)
            res = forward_prefill(mine, prompts if holds_first else None, chunking, groups,
                                  schedule=name, arrivals=arrivals, steps=steps,
                                  concurrency=concurrency, return_trace=True, timeout_s=cfg.timeout_s)
            groups.accelerator.synchronize(groups.device)  # the makespan ends when the logits exist
            makespan = max(gather_all(groups, time.perf_counter() - start))
            check_agrees(layouts[name], res.plan.layout, f"vpp serve-bench {name}")
            stats, bubble = stream_stats(res.trace, res.plan), res.trace.summarize().bubble_ratio
            replayed = (res.trace.summarize().makespan, replay(res.plan, res.trace, transfer_s).summarize().makespan)
        for st in mine:
            for q in range(len(prompts)):
                st.release(q)
        if not warmup:
            out[name] = {"makespan": makespan, "throughput": sum(p.numel() for p in prompts) / makespan}
            if stats is not None:
                out[name].update(ttft_median=stats.ttft_median, ttft_p90=stats.ttft_p90, bubble_ratio=bubble,
                                 trace_makespan=replayed[0], sim_makespan=replayed[1])
    return out


__all__ = ["CONTENDERS", "MeasuredStream", "StreamConfig", "make_workload", "run_stream_bench"]
