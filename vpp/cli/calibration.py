"""Calibrating the "this CPU" device preset by timing this machine.

1. micro-benchmarks: a float32 GEMM shaped like the tiny models' projections gives ``peak_flops`` (with
   ``eff_matmul = 1``); a large tensor copy gives ``mem_bw``; a one-element op gives a first
   ``kernel_overhead``; optionally a gloo send/recv between two local processes gives ``link_bw`` and
   ``link_latency`` (else the development machine's ~3 GB/s stays);
2. the real tiny model (:data:`vpp.models.tiny.TINY_CONFIGS`, one stage holding every layer, random
   weights) runs a chunked prefill; each chunk's time t_k is modelled by the cost model as
   ``a_k + b_k / eff_attn + c_k * kernel_overhead`` (a_k: every non-attention op at the measured rates,
   b_k: attention FLOPs at peak, c_k: kernel launches), and ``eff_attn`` and ``kernel_overhead`` are the
   least-squares fit over the chunks (so the launch constant absorbs Python's per-module cost);
3. the calibrated device predicts the same chunks; the report gives the error, which is the check that
   the cost model's FLOP/byte accounting holds for a real model on this machine.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from vpp.perf.arch import Arch
from vpp.perf.deployment import DeploymentCost
from vpp.perf.hardware import CPU, Device
from vpp.perf.ops import Parallel, embed_ops, head_ops, layer_ops


def time_median(fn, repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_rate(m: int = 512, k: int = 256, n: int = 768, repeats: int = 9) -> float:
    a, b = torch.randn(m, k), torch.randn(k, n)
    return 2.0 * m * k * n / time_median(lambda: a @ b, repeats)


def copy_bandwidth(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    x = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    y = torch.empty_like(x)
    return 2.0 * nbytes / time_median(lambda: y.copy_(x), repeats)


def op_overhead(n: int = 2000) -> float:
    x = torch.zeros(1)

    def many():
        for _ in range(n):
            torch.add(x, 1.0)
    return time_median(many, 3) / n


def _link_rank(rank: int, world: int, nbytes: int) -> tuple[float, float]:
    import torch.distributed as dist
    big, small = torch.empty(nbytes // 4), torch.empty(1)
    out = []
    for buf in (small, big):
        times = []
        for _ in range(5):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            times.append((time.perf_counter() - t0) / 2)
        out.append(statistics.median(times))
    return out[0], out[1]


def link_bandwidth(nbytes: int = 32 << 20) -> tuple[float, float]:
    """(bytes/s, latency s) of a gloo send/recv between two local processes."""
    from vpp.parallel.spawn import run_distributed
    lat, t = run_distributed(_link_rank, 2, nbytes, timeout=120.0)[0]
    return nbytes / max(t - lat, 1e-9), lat


def stage_chunk_times(cfg: dict, tokens: int, chunk: int, runs: int = 1, seed: int = 0) -> list[float]:
    """Median over ``runs`` of each chunk's time in a chunked prefill of the whole model (one stage)."""
    from vpp.models import build_stage, random_checkpoint
    from vpp.parallel import ParallelGroups
    stage = build_stage(cfg, (0, cfg["num_hidden_layers"]), ParallelGroups.single(), weights=random_checkpoint(cfg, seed))
    ids = torch.randint(0, stage.vocab_size, (tokens,), generator=torch.Generator().manual_seed(seed))

    def prefill(n: int, name) -> list[float]:
        times = []
        for start in range(0, n, chunk):
            t0 = time.perf_counter()
            stage(ids[start:start + chunk], name, start, last_token_only=True)
            times.append(time.perf_counter() - t0)
        stage.release(name)
        return times
    prefill(min(tokens, 2 * chunk), "warm-up")
    runs_ = [prefill(tokens, f"run{r}") for r in range(runs)]
    return [statistics.median(r[k] for r in runs_) for k in range(len(runs_[0]))]


def chunk_features(arch: Arch, par: Parallel, device: Device, tokens: int, prefix: int) -> tuple[float, float, float]:
    """(a, b, c) with time = a + b / eff_attn + c * kernel_overhead for the whole model on one chunk."""
    dev = device.replace(kernel_overhead=0.0, eff_attn=1.0)
    ops = embed_ops(arch, tokens, par) + head_ops(arch, tokens, par)
    for i in range(arch.layers):
        ops += layer_ops(arch, i, tokens, prefix, par)
    a = b = c = 0.0
    for op in ops:
        if op.kind == "attn":
            b += op.flops / (dev.peak_flops * (dev.lowp_speedup if op.lowp else 1.0))
        else:
            a += dev.op_time(op)
        if op.kind not in ("allreduce", "allgather"):
            c += op.kernels
    return a, b, c


def fit_stage(arch: Arch, par: Parallel, device: Device, sizes, prefixes, times) -> tuple[float, float]:
    """Least-squares (eff_attn, kernel_overhead), both kept positive."""
    feats = np.array([chunk_features(arch, par, device, n, p) for n, p in zip(sizes, prefixes)])
    y = np.asarray(times) - feats[:, 0]
    X = feats[:, 1:]
    (inv_eff, overhead), *_ = np.linalg.lstsq(X, y, rcond=None)
    if overhead <= 0:
        overhead, inv_eff = 0.0, float(np.dot(X[:, 0], y) / np.dot(X[:, 0], X[:, 0]))
    if inv_eff <= 0:
        inv_eff = 1.0
        overhead = max(0.0, float(np.dot(X[:, 1], y - X[:, 0]) / max(np.dot(X[:, 1], X[:, 1]), 1e-30)))
    return 1.0 / inv_eff, float(overhead)


def predict_and_measure(model: str, device: Device, tokens: int, chunk: int, runs: int) -> dict:
    """A tiny model's measured chunk times next to the cost model's prediction on ``device``."""
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.schedules import make_layout
    cfg = TINY_CONFIGS[model]
    arch = Arch.from_config(cfg, name=model)
    par = Parallel(tp=1, act_bytes=4, weight_bytes=4, kv_bytes=4)
    cost = DeploymentCost(arch, device, make_layout("loop", arch.layers, 1), par)
    times = stage_chunk_times(cfg, tokens, chunk, runs)
    pred = [cost.compute(0, min(chunk, tokens - s), s) for s in range(0, tokens, chunk)]
    err = [abs(p - t) / t for p, t in zip(pred, times)]
    return {"model": model, "tokens": tokens, "chunk": chunk, "measured": times, "predicted": pred,
            "mean_abs_error": float(np.mean(err)), "max_abs_error": float(np.max(err)),
            "last_over_first_measured": times[-1] / times[0], "last_over_first_predicted": pred[-1] / pred[0]}


def calibrate(model: str = "tiny-deepseek", tokens: int = 4096, chunk: int = 512, *, threads: int = 1,
              runs: int = 3, link: bool = False, check=()) -> dict:
    """Time this machine and the tiny model; returns {"device": fields, "validation": ..., "sources": ...}."""
    from vpp.models.tiny import TINY_CONFIGS
    torch.set_num_threads(threads)
    cfg = TINY_CONFIGS[model]
    peak, bw, overhead = matmul_rate(), copy_bandwidth(), op_overhead()
    dev = CPU.replace(peak_flops=peak, mem_bw=bw, kernel_overhead=overhead, eff_matmul=1.0, eff_mem=1.0)
    sources = {"peak_flops": "float32 GEMM 512x256 @ 256x768 on this machine", "mem_bw": "64 MB tensor copy",
               "kernel_overhead": f"least squares on the {model} chunk times (micro-benchmark {overhead:.2e} s/op)",
               "eff_attn": f"least squares on the {model} chunk times"}
    if link:
        lbw, lat = link_bandwidth()
        dev = dev.replace(link_bw=lbw, link_latency=lat, eff_link=1.0)
        sources["link_bw"] = sources["link_latency"] = "gloo send/recv between two local processes"
    arch = Arch.from_config(cfg, name=model)
    par = Parallel(tp=1, act_bytes=4, weight_bytes=4, kv_bytes=4)
    times = stage_chunk_times(cfg, tokens, chunk, runs)
    sizes = [min(chunk, tokens - s) for s in range(0, tokens, chunk)]
    prefixes = list(range(0, tokens, chunk))
    eff_attn, kernel = fit_stage(arch, par, dev, sizes, prefixes, times)
    dev = dev.replace(eff_attn=eff_attn, kernel_overhead=kernel)
    from vpp.schedules import make_layout
    cost = DeploymentCost(arch, dev, make_layout("loop", arch.layers, 1), par)
    pred = [cost.compute(0, n, p) for n, p in zip(sizes, prefixes)]
    err = [abs(p - t) / t for p, t in zip(pred, times)]
    checks = [predict_and_measure(m, dev, tokens, chunk, runs) for m in check if m != model]
    fields = {k: getattr(dev, k) for k in ("peak_flops", "mem_bw", "link_bw", "lowp_speedup", "eff_matmul",
                                             "eff_attn", "eff_mem", "eff_link", "link_latency", "kernel_overhead")}
    return {"device": fields, "sources": sources,
            "validation": {"model": model, "tokens": tokens, "chunk": chunk, "threads": threads,
                           "measured": times, "predicted": pred, "mean_abs_error": float(np.mean(err)),
                           "max_abs_error": float(np.max(err)),
                           "last_over_first_measured": times[-1] / times[0],
                           "last_over_first_predicted": pred[-1] / pred[0]},
            "cross_check": checks}


__all__ = [
    "calibrate", "chunk_features", "copy_bandwidth", "fit_stage", "link_bandwidth", "matmul_rate",
    "op_overhead", "predict_and_measure", "stage_chunk_times", "time_median",
]
