"""Measure prefill schedules on real ranks: the engine behind ``vpp prefill``, the examples and the
benchmarks. Runs on every rank (spawned or under torchrun); returns rows on every rank.

Per round, the schedules run interleaved (A B C A B C ...), each after a barrier. TTFT is the wall time
from the barrier to the last-token logits on the rank that holds the last stage (on an accelerator,
after synchronising the device there, so the logits exist).

Memory: each run records every rank's peak memory (:meth:`Accelerator.peak_memory`: the allocator's
``max_memory_allocated`` on CUDA/NPU, reset per run; the process's peak resident set on CPU, which
also holds the interpreter and every schedule's weights), its stages' weights and the bytes their KV
caches hold at the end of the run. Each run's trace is
summarised (compute / bubble / exposed comm, as the paper's Table 2) and replayed in the simulator with
the measured per-chunk compute times and a measured transfer time, so the two can be compared.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from vpp.models.registry import open_model
from vpp.parallel.comm import irecv, isend
from vpp.parallel.groups import ParallelGroups
from vpp.schedules import TableCost, simulate_plan, strategies
from vpp.runtime.api import forward_prefill
from vpp.runtime.dcpp_profile import profile_planner
from vpp.runtime.layout_inference import check_agrees

from vpp.models.run_layout import layout_for
from vpp.perf.memory_plan import planned_chunk
from vpp.perf.taper import tapered_chunking
from vpp.cli.terminal import RankProgress

log = logging.getLogger(__name__)


@dataclass
class BenchConfig:
    model: str = "tiny-deepseek"
    tp: int = 1
    pp: int = 2
    seq_len: int = 8192
    chunk_size: int = 2048           # the defaults of ``vpp prefill`` (vpp.cli.prefill: why these)
    schedules: tuple[str, ...] = ("cpp", "vpp", "vpp-async")
    folds: int = 1
    partition: str = "rank"          # "rank": balanced per rank on the cost model (partition.py); "even"
    repeat: int = 5
    warmup: bool = True
    dtype: str = "auto"  # "auto": a model directory's config dtype, float32 for the built-in models (bf16 on devices)
    seed: int = 0
    moe_dispatch: str = "allreduce"
    timeout_s: float = 600.0
    check: bool = False
    trace_dir: str | None = None
    save_logits: str | None = None
    # progress(label, chunks) -> a callback(chunks done) shown on global rank 0 (the CLI's bar), or None
    progress: Callable[[str, int], Callable[[int], None]] | None = None
    pin: bool = True
    prompt: list[int] | None = None  # token ids (e.g. a tokenized text); None: seq_len random ids
    cached_prefix: int = 0           # the first N tokens are prefilled untimed before each timed run
    dcpp_mode: str = "vllm-ascend"   # a vpp.schedules.dcpp.VARIANTS mode
    dcpp_min_chunk: int | None = None
    # schedule -> its layout, chosen once by the command (vpp.models.run_layout.layout_for); None: chosen here
    layouts: dict | None = None
    cp: int = 1                      # context-parallel ranks per stage (each chunk's tokens split over them)
    cp_attention: str = "auto"       # vpp.models.cp_state.CP_METHODS
    taper: tuple = ((), ())          # (head, tail) fractions of chunk_size: tapered fixed chunks (vpp.perf.taper)


@dataclass
class MeasuredPrefill:
    """One schedule's measured prefill over the rounds (one value per round), beside its simulated replay
    (the measured stream's counterpart is :class:`vpp.cli.stream_rounds.MeasuredStream`)."""

    schedule: str
    ttft: list[float] = field(default_factory=list)
    makespan: list[float] = field(default_factory=list)
    bubble_ratio: list[float] = field(default_factory=list)
    exposed: list[float] = field(default_factory=list)
    speedup: list[float] = field(default_factory=list)
    sim_makespan: list[float] = field(default_factory=list)
    sim_bubble_ratio: list[float] = field(default_factory=list)
    overhead_per_action_us: list[float] = field(default_factory=list)
    max_abs_diff: float | None = None
    # per global rank: the largest peak over the rounds, with its weights and KV cache bytes
    memory: list[dict] = field(default_factory=list)

    def stats(self, name: str) -> tuple[float, float, float]:
        values = getattr(self, name)
        return (statistics.median(values), min(values), max(values)) if values else (float("nan"),) * 3


def say(groups: ParallelGroups, text: str) -> None:
    """Log ``text`` once per run (from global rank 0)."""
    if groups.global_rank == 0:
        log.info(text)


def measure_transfer(groups: ParallelGroups, tokens: int, hidden: int, dtype: torch.dtype, rounds: int = 5) -> float:
    """One-way time of a [tokens, hidden] activation between pipeline ranks 0 and 1 (ping-pong / 2),
    the probe on the rank's device (what the pipeline sends). Measurement, not the per-chunk path: it
    synchronises the device around each round so the host clock sees the transfer."""
    if groups.pp.size < 2:
        return 0.0
    me, buf = groups.pp.rank, torch.zeros(tokens, hidden, dtype=dtype, device=groups.device)
    acc, times = groups.accelerator, []
    for _ in range(rounds + 1):
        acc.synchronize(groups.device)
        start = time.perf_counter()
        if me == 0:
            isend(buf, 1, groups.pp_channel(0, 1)).wait()
            irecv(buf, 1, groups.pp_channel(1, 0)).wait()
        elif me == 1:
            irecv(buf, 0, groups.pp_channel(0, 1)).wait()
            isend(buf, 0, groups.pp_channel(1, 0)).wait()
        acc.synchronize(groups.device)  # NCCL/HCCL wait() only orders the stream
        times.append((time.perf_counter() - start) / 2)
    out = [statistics.median(times[1:])]
    dist.broadcast_object_list(out, src=groups.pp.global_rank(0), group=groups.pp.pg)
    return float(out[0])


def replay(plan, trace, transfer_s: float):
    """Replay ``plan`` with the compute times measured in ``trace`` (median per stage and chunk). The
    executed plan itself is simulated (:func:`vpp.schedules.simulate_plan`), not rebuilt by the runner
    from its strategy: a plan keeps only the steps shared by two or more pieces, so the builder's step
    list cannot be recovered from it."""
    per_stage: dict[int, dict] = {}
    requests = {q.id: q for q in plan.requests}
    for s in trace.of(kind="compute"):
        q = requests[s.request]
        per_stage.setdefault(s.stage, {})[(q.tokens(s.chunk), q.offset(s.chunk))] = s.duration
    cost = TableCost(per_stage=per_stage, latency=transfer_s, overlap=0.0 if plan.comm == "blocking" else 1.0)
    return simulate_plan(plan, cost, check=False)


SHORT_WARMUP = 256  # tokens of the warm-up of a single round (one short chunk through every stage)


def warmup_tokens(cfg: BenchConfig) -> int:
    """Tokens of the untimed warm-up run of each schedule: two chunks (the timed runs' shapes) when
    there are several rounds; with ``repeat=1`` a short prompt of at most :data:`SHORT_WARMUP` tokens,
    which warms the communicators and allocators without computing a long prompt twice."""
    if cfg.repeat == 1:
        return min(cfg.seq_len, SHORT_WARMUP)
    return min(cfg.seq_len, 2 * cfg.chunk_size)


def chunks_of(chunking, n: int, cached: int = 0) -> list[int]:
    """A chunking function's chunk sizes for ``n`` tokens after ``cached`` ones (the call convention
    of :func:`vpp.runtime.inputs.requests_for`)."""
    return list(chunking(n, cached=cached) if cached else chunking(n))


def run_bench(groups: ParallelGroups, cfg: BenchConfig) -> tuple[list[MeasuredPrefill], dict]:
    """Run every schedule ``cfg.repeat`` times, interleaved; returns the rows and run facts."""
    if cfg.pin and groups.accelerator.kind == "cpu" and groups.sizes.world_size <= (os.cpu_count() or 1):
        os.sched_setaffinity(0, {groups.global_rank % (os.cpu_count() or 1)})
    model = open_model(cfg.model, dtype=cfg.dtype, seed=cfg.seed, moe_dispatch=cfg.moe_dispatch,
                       device_kind=groups.accelerator.kind)
    dtype = model.dtype
    vocab = int(model.config.get("vocab_size", 512))
    if cfg.prompt is not None:
        prompt = torch.tensor(cfg.prompt, dtype=torch.long)
    else:
        prompt = torch.randint(0, vocab, (cfg.seq_len,), generator=torch.Generator().manual_seed(cfg.seed + 1))
    layouts = cfg.layouts or {sched: layout_for(model, sched, groups.pp.size, cfg.folds, chunk=cfg.chunk_size,
                                                seq_len=cfg.seq_len, partition=cfg.partition) for sched in cfg.schedules}
    stages = {sched: model.stages(layouts[sched], groups) for sched in cfg.schedules}
    for st in (st for sched in cfg.schedules for st in stages[sched]):
        st.cp_method = cfg.cp_attention  # read only under context parallelism
    cp = f" cp={cfg.cp}" if cfg.cp > 1 else ""
    say(groups, f"vpp prefill: {cfg.model}, tp={cfg.tp}{cp} pp={cfg.pp}, {cfg.seq_len} tokens in chunks of "
                 f"{cfg.chunk_size}; " + "; ".join(f"{s}: {layouts[s].describe()}" for s in cfg.schedules))
    # DCPP's planner is profiled once on the real stages of its mode's profiled rank (start-up profiling)
    chunk = planned_chunk(cfg.chunk_size, cfg.seq_len)  # every chunk-sized buffer as the memory plan sized it
    fixed = tapered_chunking(cfg.chunk_size, *cfg.taper) if any(cfg.taper) else cfg.chunk_size
    chunking = {s: profile_planner(stages[s], groups, chunk, variant=cfg.dcpp_mode,
                                   min_chunk=cfg.dcpp_min_chunk).chunk_sizes
                if strategies.get(s).chunking == "dcpp" else fixed for s in cfg.schedules}
    hidden = stages[cfg.schedules[0]][0].hidden_size
    transfer_s = measure_transfer(groups, -(-chunk // cfg.cp), hidden, dtype)  # a CP rank sends its share
    rows = {s: MeasuredPrefill(s) for s in cfg.schedules}
    holds_first = {s: 0 in layouts[s].stages_of(groups.pp.rank) for s in cfg.schedules}
    last_logits: dict[str, torch.Tensor | None] = {}
    traces = {}
    acc, device = groups.accelerator, groups.device
    memory: dict[str, dict] = {}

    def one(sched: str, ids: torch.Tensor, label: str | None, cached: int = 0):
        n = ids.numel() - cached
        n_chunks = len(chunks_of(chunking[sched], n, cached)) if callable(chunking[sched]) else -(-n // cfg.chunk_size)
        show = label and cfg.progress is not None and groups.global_rank == 0
        bar = cfg.progress(label, n_chunks) if show else None
        if label and cfg.progress is not None and groups.tp.rank == 0:  # each pipeline rank tells its computes
            spans = {s: layouts[sched].stage_layers[s] for s in layouts[sched].stages_of(groups.pp.rank)}
            bar = RankProgress(label, groups.pp.rank, {s: b - a for s, (a, b) in spans.items()}, n_chunks, bar=bar)
        if cached:  # the cached prefix: prefilled untimed, its caches left in the stages for request 0
            forward_prefill(stages[sched], ids[:cached] if holds_first[sched] else None, chunking[sched], groups,
                            schedule=sched, timeout_s=cfg.timeout_s)
        if dist.is_initialized():
            dist.barrier()
        acc.reset_peak_memory(device)
        start = time.perf_counter()
        out = forward_prefill(stages[sched], ids if holds_first[sched] else None, chunking[sched], groups,
                              schedule=sched, return_trace=True, timeout_s=cfg.timeout_s, progress=bar,
                              cached_tokens=cached)
        if out.logits is not None:
            acc.synchronize(device)  # TTFT ends when the logits exist (a no-op on CPU)
        ttft = time.perf_counter() - start
        mem = {"peak_bytes": acc.peak_memory(device), "peak_reserved_bytes": acc.peak_memory_reserved(device),
               "weights_bytes": weight_bytes(stages[sched]),
               "kv_cache_bytes": sum(cache_bytes(st) for st in stages[sched])}
        if mem["peak_bytes"] >= memory.get(sched, {}).get("peak_bytes", -1):
            memory[sched] = mem
        for st in stages[sched]:
            st.release(0)
        return out, ttft

    if cfg.warmup:
        for sched in cfg.schedules:
            one(sched, prompt[:warmup_tokens(cfg)], None)
    for r in range(cfg.repeat):
        round_ttft = {}
        for sched in cfg.schedules:
            out, ttft = one(sched, prompt, f"round {r + 1}/{cfg.repeat} {sched}", cfg.cached_prefix)
            ttfts = gather_all(groups, ttft if out.logits is not None else None)
            ttft = max(t for t in ttfts if t is not None)
            check_agrees(layouts[sched], out.plan.layout, f"vpp prefill --schedule {sched}")
            summary = out.trace.summarize()
            sim = replay(out.plan, out.trace, transfer_s)
            sim_summary = sim.summarize()
            row = rows[sched]
            row.ttft.append(ttft)
            row.makespan.append(summary.makespan)
            row.bubble_ratio.append(summary.bubble_ratio)
            row.exposed.append(summary.mean("exposed_comm"))
            row.sim_makespan.append(sim_summary.makespan)
            row.sim_bubble_ratio.append(sim_summary.bubble_ratio)
            overheads = gather_all(groups, out.result.overhead_s / max(out.result.num_actions, 1) * 1e6)
            row.overhead_per_action_us.append(max(overheads))
            round_ttft[sched] = ttft
            # to the host before pickling: a device tensor would be unpickled onto another rank's card
            logits = [t for t in gather_all(groups, None if out.logits is None else out.logits.cpu()) if t is not None]
            last_logits[sched] = logits[0]
            traces[sched] = (out.trace, sim)
        base = round_ttft.get("cpp")
        for sched, t in round_ttft.items():
            if base:
                rows[sched].speedup.append(base / t)
    for sched in cfg.schedules:
        per_rank = gather_all(groups, dict(memory.get(sched, {}), rank=groups.global_rank))
        rows[sched].memory = sorted(per_rank, key=lambda m: m["rank"])
    facts = {"transfer_s": transfer_s, "layouts": {s: layouts[s].describe() for s in cfg.schedules},
             "partitions": {s: list(layouts[s].partition) for s in cfg.schedules},
             "memory_method": acc.peak_memory_method,
             "prompt": prompt, "logits": last_logits,
             "chunks": {s: chunks_of(c, cfg.seq_len - cfg.cached_prefix, cfg.cached_prefix) if callable(c) else None
                        for s, c in chunking.items()}}
    if cfg.check:
        facts["check"] = _check(groups, model, prompt, last_logits, list(rows.values()))
    if cfg.trace_dir and groups.global_rank == 0:  # written by the report, after the results (an extra)
        facts["traces"] = traces
    return [rows[s] for s in cfg.schedules], facts


def weight_bytes(stages) -> int:
    """Bytes of the parameters of a rank's stages."""
    return sum(p.nbytes for st in stages for p in st.parameters())


def cache_bytes(stage) -> int:
    """Bytes a stage's KV caches hold (stages without ``cache_nbytes``, like the toy model: 0)."""
    nbytes = getattr(stage, "cache_nbytes", None)
    return int(nbytes()) if nbytes is not None else 0


def gather_all(groups: ParallelGroups, value):
    if not dist.is_initialized() or groups.sizes.world_size == 1:
        return [value]
    out: list = [None] * groups.sizes.world_size
    dist.all_gather_object(out, value)
    return out


def _check(groups: ParallelGroups, model, prompt, last_logits, rows) -> dict:
    """Compare every schedule's last-token logits with a single-process unpipelined forward."""
    result: dict = {}
    if groups.global_rank == 0:
        ref_stage = model.build((0, model.num_layers), ParallelGroups.single(groups.accelerator, groups.device))
        ref = ref_stage(prompt.to(groups.device), "reference", 0, last_token_only=True)[-1].float().cpu()
        for row in rows:
            got = last_logits[row.schedule].float()
            row.max_abs_diff = float((got - ref).abs().max())
            result[row.schedule] = row.max_abs_diff
        result["reference_argmax"] = int(ref.argmax())
        result["reference_max_abs"] = float(ref.abs().max())
        if not bool(torch.isfinite(ref).all()):  # never a pass: name where the reference stopped being finite
            layer = ref_stage.nonfinite_layer("reference")
            result["reference_nonfinite"] = ("the unpipelined reference's logits hold NaN or Inf"
                                             + (f" (first at the output of layer {layer})" if layer is not None else ""))
    out = gather_all(groups, result)
    return out[0]


def write_traces(directory: str, traces: dict) -> list[str]:
    """Write each schedule's measured and simulated traces (JSON, Chrome, PNG); returns the paths."""
    os.makedirs(directory, exist_ok=True)
    written = []
    for sched, (measured, sim) in traces.items():
        for path, write in ((f"{sched}.trace.json", measured.save), (f"{sched}.chrome.json", measured.to_chrome),
                            (f"{sched}.simulated.chrome.json", sim.to_chrome)):
            write(os.path.join(directory, path))
            written.append(os.path.join(directory, path))
        try:
            for path, trace in ((f"{sched}.png", measured), (f"{sched}.simulated.png", sim)):
                trace.plot(os.path.join(directory, path))
                written.append(os.path.join(directory, path))
        except ImportError:
            log.warning("matplotlib is not installed: skipping PNG timelines (pip install matplotlib, or -e '.[plot]' in a clone)")
    return written


__all__ = [
    "BenchConfig", "MeasuredPrefill", "cache_bytes", "chunks_of", "gather_all", "measure_transfer",
    "replay", "run_bench", "say", "warmup_tokens", "weight_bytes", "write_traces",
]
