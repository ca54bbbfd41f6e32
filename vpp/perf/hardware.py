"""Device descriptions and how long an operation takes on one.

An op's time is a roofline plus a launch cost::

    gemm / attn : max(flops / (peak * rate * eff), bytes / (mem_bw * eff_mem)) + kernels * kernel_overhead
    mem         : bytes / (mem_bw * eff_mem) + kernels * kernel_overhead
    allreduce   : 2 (n-1) link_latency + 2 (n-1)/n * bytes / (link_bw * eff_link)      (ring)
    allgather   :   (n-1) link_latency +   (n-1)/n * bytes / (link_bw * eff_link)
    p2p         :         link_latency +             bytes / (link_bw * eff_link)
    alltoall    :   (n-1) link_latency +   (n-1)/n * bytes / (bw * eff_link)           (pairwise)

``rate`` is ``lowp_speedup`` for low-precision GEMMs (INT8/FP8) and 1 otherwise; ``eff`` is
``eff_attn`` for attention kernels and ``eff_matmul`` for GEMMs. ``host_step`` is host work per engine step,
device idle only where the runner synchronises before a step (:mod:`.deployment`); a context-parallel ring
runs on ``link_bw`` while its devices fit one node (``node_devices``), on ``cp_link_bw`` beyond. Every constant of a preset carries its
source in ``sources``; "fitted" ones are set by :mod:`benchmarks.paper.fit` (on the paper's CPP rows only).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from .ops import Op


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float              # dense BF16 matmul FLOP/s
    mem_bw: float                  # HBM bytes/s
    mem_bytes: float               # HBM capacity
    link_bw: float                 # per-device unidirectional bytes/s for TP collectives and PP sends
    lowp_speedup: float = 2.0      # INT8/FP8 GEMM rate over BF16
    eff_matmul: float = 0.7
    eff_attn: float = 0.5
    eff_mem: float = 0.8
    eff_link: float = 0.8
    link_latency: float = 10e-6    # per collective step / per p2p message
    kernel_overhead: float = 10e-6  # per kernel launch
    step_overhead: float = 0.0     # per forward step (one stage on one chunk): host scheduling
    host_step: float = 0.0         # host work before a step's first kernel (scheduling, input and attention
                                   # metadata); device idle ("launch stall") only where the runner syncs the
                                   # device before the step (DCPP's online timing), hidden otherwise
    pp_overlap: float = 1.0        # share of an async PP transfer that hides behind compute
    pp_link_bw: float | None = None  # per-device bytes/s between pipeline stages (None: link_bw)
    eff_irregular: float | None = None  # share of mem_bw reached by top-k selection (None: eff_mem)
    cp_link_bw: float | None = None  # per-device bytes/s around a context-parallel ring (None: pp_link_bw or link_bw)
    node_devices: int | None = None  # devices sharing the fast link (link_bw); None: every device does
    sources: dict = field(default_factory=dict, compare=False)

    def replace(self, **changes) -> "Device":
        return dataclasses.replace(self, **changes)

    # -- op times -----------------------------------------------------------------------------------
    def op_time(self, op: Op) -> float:
        eff_mem = self.eff_irregular if (op.irregular and self.eff_irregular) else self.eff_mem
        if op.kind in ("gemm", "attn"):
            eff = self.eff_attn if op.kind == "attn" else self.eff_matmul
            rate = self.peak_flops * eff * (self.lowp_speedup if op.lowp else 1.0)
            t = max(op.flops / rate, op.bytes / (self.mem_bw * eff_mem))
        elif op.kind == "mem":
            t = op.bytes / (self.mem_bw * eff_mem)
        elif op.kind == "allreduce":
            return self.allreduce(op.bytes, op.group)
        elif op.kind == "allgather":
            return self.allgather(op.bytes, op.group)
        else:
            raise ValueError(f"unknown op kind {op.kind!r} ({op.name})")
        return t + op.kernels * self.kernel_overhead

    def allreduce(self, nbytes: float, n: int) -> float:
        if n <= 1:
            return 0.0
        return 2 * (n - 1) * self.link_latency + 2 * (n - 1) / n * nbytes / (self.link_bw * self.eff_link)

    def allgather(self, nbytes: float, n: int) -> float:
        if n <= 1:
            return 0.0
        return (n - 1) * self.link_latency + (n - 1) / n * nbytes / (self.link_bw * self.eff_link)

    def p2p(self, nbytes: float) -> float:
        return self.link_latency + nbytes / (self.link_bw * self.eff_link)

    def pp_p2p(self, nbytes: float) -> float:
        """A send between pipeline stages (a different link when stages sit on different nodes)."""
        return self.link_latency + nbytes / ((self.pp_link_bw or self.link_bw) * self.eff_link)

    def cp_p2p(self, nbytes: float, bw: float | None = None) -> float:
        """One ring step's send between context-parallel ranks (a KV or query block), over ``bw``
        (default: the network, ``cp_bw``)."""
        return self.link_latency + nbytes / ((bw or self.cp_bw) * self.eff_link)

    def ring_bw(self, group_devices: int) -> float:
        """Bandwidth of a ring whose groups span ``group_devices`` devices (tp x cp): the fast link
        inside a node, the network (``cp_bw``) once the group crosses nodes."""
        if self.node_devices is None or group_devices <= self.node_devices:
            return self.link_bw
        return self.cp_bw

    def alltoall(self, nbytes: float, n: int, bw: float | None = None) -> float:
        """Each of ``n`` devices exchanges ``nbytes`` in all with the other ``n - 1`` (pairwise steps)."""
        if n <= 1:
            return 0.0
        return (n - 1) * self.link_latency + (n - 1) / n * nbytes / ((bw or self.link_bw) * self.eff_link)

    @property
    def cp_bw(self) -> float:
        return self.cp_link_bw or self.pp_link_bw or self.link_bw

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Device":
        return cls(**d)


_ASSUMED_EFF = "assumed: typical achieved share of peak for large GEMMs (0.7) / streaming copies (0.8); not fitted"

ASCEND_910C = Device(
    name="ascend-910c-die", peak_flops=376e12, mem_bw=1.6e12, mem_bytes=64e9, link_bw=200e9,
    lowp_speedup=2.0, eff_matmul=0.7, eff_attn=0.5, eff_mem=0.8, eff_link=0.8,
    link_latency=10e-6, kernel_overhead=10e-6,
    sources={
        "unit": "one die of a dual-die Ascend 910C package = one 'NPU' of the paper (64 GB HBM each, 16 per "
                "Atlas 900 A3 node)",
        "peak_flops": "752 TFLOPS dense BF16 per 910C package (CloudMatrix384 paper, arXiv:2506.12708; "
                      "TechPowerUp/DigiTimes give ~780), halved per die",
        "mem_bw": "3.2 TB/s per package from 8 HBM2E stacks (TechPowerUp, Apr 2025), halved per die",
        "mem_bytes": "64 GB HBM per NPU (the paper, Sec. 6.1)",
        "link_bw": "400 GB/s chip-to-chip per package (TechPowerUp/DigiTimes), halved per die",
        "lowp_speedup": "INT8 cube rate = 2x FP16 on Da Vinci (Ascend 910: 256 TFLOPS FP16 / 512 TOPS INT8, "
                        "Hot Chips 2019); DeepSeek-V3.1/GLM-5.2 run W8A8 here (671B/744B in BF16 do not fit "
                        "16 x 64 GB), an assumption: the paper does not state the weight format",
        "eff_matmul": _ASSUMED_EFF, "eff_mem": _ASSUMED_EFF,
        "eff_attn": "fitted on the paper's CPP 512K compute time (benchmarks.paper.fit)",
        "eff_link": "fitted on the paper's CPP 512K exposed communication (benchmarks.paper.fit)",
        "link_latency": "assumed 10 us per collective step (HCCL small-message latency order; no datasheet)",
        "kernel_overhead": "assumed 10 us per kernel (torch_npu eager dispatch order; no datasheet)",
        "host_step": "fitted on the paper's DCPP launch stall, Table 2(c) (benchmarks.paper.fit); 0 until fitted",
        "fit": "eff_attn 0.5 and eff_link 0.8 above are placeholders; the fitted values live with their fit, in "
               "benchmarks/results/paper_repro.json ('fit'): pass that file as the calibration to use them",
    })

_NV = {
    "peak_flops": "NVIDIA H100/H200 SXM datasheet: 1,979 TFLOPS BF16 with sparsity = 989 dense",
    "lowp_speedup": "datasheet FP8 (3,958 sparse / 1,979 dense) = 2x BF16",
    "link_bw": "NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction (datasheet)",
    "eff_link": "nccl-tests all-reduce bus bandwidth ~360 GB/s of 450 on 8 x H100 NVLink",
    "eff_attn": "FlashAttention-3 reaches 0.6-0.75 of BF16 peak forward on H100 (Shah et al. 2024); 0.6 taken",
    "eff_matmul": _ASSUMED_EFF, "eff_mem": _ASSUMED_EFF,
    "link_latency": "assumed 5 us per NCCL ring step",
    "kernel_overhead": "assumed 4 us per CUDA kernel launch (eager)",
    "pp_link_bw": "16 GPUs = 2 x 8-GPU nodes: PP crosses nodes over one 400 Gb/s ConnectX-7 NIC per GPU "
                  "(DGX H100/H200 datasheet) = 50 GB/s",
    "cp_link_bw": "a context-parallel ring across nodes uses the same 400 Gb/s NIC per GPU (None: pp_link_bw)",
    "node_devices": "8 GPUs per NVLink domain (DGX / HGX H100 and H200 datasheets)",
}

H100 = Device(
    name="h100-sxm", peak_flops=989e12, mem_bw=3.35e12, mem_bytes=80e9, link_bw=450e9, lowp_speedup=2.0,
    eff_matmul=0.7, eff_attn=0.6, eff_mem=0.8, eff_link=0.8, link_latency=5e-6, kernel_overhead=4e-6,
    pp_link_bw=50e9, node_devices=8, sources={**_NV, "mem_bw": "H100 SXM datasheet: 3.35 TB/s HBM3", "mem_bytes": "80 GB HBM3 (datasheet)"})

H200 = H100.replace(name="h200-sxm", mem_bw=4.8e12, mem_bytes=141e9,
                    sources={**_NV, "mem_bw": "H200 SXM datasheet: 4.8 TB/s HBM3e",
                             "mem_bytes": "141 GB HBM3e (datasheet)"})

# This machine, before `vpp calibrate` has run: the development machine's notes (one layer of 8 heads x 64 at 16K in 1K
# chunks: tau_k ~ 89 + 34 k ms, i.e. 34 ms per 1K x 1K x 8 heads x 64 x 4 FLOPs = 63 GFLOP/s of attention;
# gloo ~3 GB/s between two local ranks). `vpp calibrate` replaces these with timed values.
CPU = Device(
    name="cpu", peak_flops=63e9, mem_bw=10e9, mem_bytes=16e9, link_bw=3e9, lowp_speedup=1.0,
    eff_matmul=1.0, eff_attn=1.0, eff_mem=1.0, eff_link=1.0, link_latency=50e-6, kernel_overhead=20e-6,
    sources={"all": "placeholders (the development machine's timings: one layer of 8 heads x 64, 1K chunks, ~3 GB/s gloo) until `vpp calibrate` times the tiny model"})

PRESETS = {"ascend-910c": ASCEND_910C, "910c": ASCEND_910C, "h100": H100, "h200": H200, "cpu": CPU}


def get_device(name: str, calibration: str | None = None) -> Device:
    """A preset by name, with the constants of a calibration JSON if given: ``vpp calibrate``'s file for
    ``"cpu"`` (its ``"device"``), or any file whose ``"fit"`` holds fitted constants (for instance
    ``benchmarks/results/paper_repro.json``, the paper study's fit of ``eff_attn``, ``eff_link`` and
    ``host_step`` on the 910C)."""
    key = name.lower()
    if key not in PRESETS:
        raise KeyError(f"unknown device {name!r}; presets: {sorted(PRESETS)}")
    dev = PRESETS[key]
    if calibration:
        with open(calibration) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError(f"{calibration}: not a calibration (a JSON object with 'device' or 'fit')")
        constants = data.get("device", data.get("fit", data))
        dev = dev.replace(**{k: v for k, v in constants.items() if k in _FIELDS and k not in ("name", "sources")})
    return dev


_FIELDS = {f.name for f in dataclasses.fields(Device)}


__all__ = ["ASCEND_910C", "CPU", "Device", "H100", "H200", "PRESETS", "get_device"]
