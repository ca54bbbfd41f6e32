"""The expert GEMMs of a MoE layer: which kernel runs on which device, and the experts as stacked weights.

Expert GEMMs, and why there is no host synchronisation. The (token, expert) pairs are sorted by
local expert, so each expert's rows are one contiguous segment; the segment ends are computed on the
device (a search in the sorted ids) and handed to a grouped GEMM, one kernel for every local expert:
``torch._grouped_mm`` on CUDA, ``torch_npu.npu_grouped_matmul`` on NPU (each import-guarded; on NPU in
calls of at most 128 local experts, older releases' limit, see :func:`npu_grouped_mm`). Pairs
routed to other EP ranks' experts sort after the local ones into a segment no GEMM reads, so every
shape is static (T k rows) and nothing waits for the device. On CPU, where reading a tensor costs
nothing, :class:`GroupedExperts` keeps the plain per-expert loop with the counts on the host: the
reference the grouped path is tested against (``gemm="grouped_mm"`` forces the grouped path on CPU,
where torch implements it too). ``torch._grouped_mm`` has a fused kernel only for bf16 on sm90/sm100
(torch >= 2.9); elsewhere it falls back to a loop that copies the offsets to the host for every expert
GEMM (and torch < 2.9 raises for fp32), so :func:`choose_expert_gemm` refuses float32 experts on CUDA
with one line (use bf16, the default on accelerators) and runs other 16-bit cases with the per-expert
loop (one host read of the counts per layer and chunk, with a warning). "alltoall" dispatch with the
grouped GEMM exchanges fixed-capacity blocks (:meth:`vpp.transformer.moe.MoE._forward_alltoall_fixed`),
so it reads no split size on the host either; with the loop (CPU) it takes them as host lists.
"""

from __future__ import annotations

import importlib
import logging
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from vpp.transformer import cpu_ops
from vpp.transformer.fused_ops import gated_halves
from vpp.transformer.moe_config import ACTIVATIONS

log = logging.getLogger(__name__)

GEMMS = ("loop", "grouped_mm", "npu")


GROUPED_MM_ARCHS = ((9, 0), (10, 0))
GROUPED_MM_TORCH = (2, 9)


def choose_expert_gemm(device_type: str, dtype: torch.dtype, *, capability: tuple[int, int] | None = None,
                       torch_version: tuple[int, int] = (0, 0), has_grouped_mm: bool = False,
                       has_npu_gmm: bool = False) -> str:
    """The expert GEMM for experts of ``dtype`` on a ``device_type`` device with these facts (pure, so
    every case is tested on CPU): ``"grouped_mm"``, ``"npu"`` or ``"loop"``; raises ValueError (one
    line) for float32 experts on CUDA, which no fused grouped kernel runs."""
    if device_type == "cuda":
        fused = (has_grouped_mm and dtype == torch.bfloat16 and capability in GROUPED_MM_ARCHS
                 and torch_version >= GROUPED_MM_TORCH)
        if fused:
            return "grouped_mm"
        if dtype == torch.float32:
            raise ValueError(f"float32 MoE experts on CUDA (sm{''.join(map(str, capability or ()))}, torch "
                             f"{'.'.join(map(str, torch_version))}) would copy the expert offsets to the host for "
                             f"every expert GEMM (torch._grouped_mm fuses only bf16 on sm90/sm100, torch >= 2.9): "
                             f"run the model in bfloat16 (--dtype bfloat16 or auto)")
        return "loop"
    if device_type == "npu" and has_npu_gmm:
        return "npu"
    return "loop"


@lru_cache(maxsize=None)
def expert_gemm_for(device: torch.device, dtype: torch.dtype) -> str:
    """:func:`choose_expert_gemm` with this machine's facts for ``device`` (warns where it falls back
    to the per-expert loop on an accelerator)."""
    facts = {}
    if device.type == "cuda":
        version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        facts = dict(capability=tuple(torch.cuda.get_device_capability(device)), torch_version=version,
                     has_grouped_mm=hasattr(torch, "_grouped_mm"))
    elif device.type == "npu":
        facts = dict(has_npu_gmm=hasattr(_torch_npu(), "npu_grouped_matmul"))
    gemm = choose_expert_gemm(device.type, dtype, **facts)
    if gemm == "loop" and device.type not in ("cpu", "meta"):
        log.warning("no fused grouped GEMM for %s experts on %s: MoE falls back to the per-expert loop, which reads "
                    "the expert counts on the host once per layer and chunk", dtype, device)
    return gemm


NPU_GMM_MAX_GROUPS = 128  # older torch_npu / CANN releases: at most 128 groups (weights) per call


def npu_gmm_calls(groups: int, max_groups: int = NPU_GMM_MAX_GROUPS) -> list[tuple[int, int]]:
    """The expert ranges [g0, g1) of the ``npu_grouped_matmul`` calls for ``groups`` local experts:
    consecutive, as even as possible, each at most ``max_groups`` (DeepSeek-V3 at EP 1 has 256 local
    experts: two calls of 128)."""
    if groups < 1 or max_groups < 1:
        raise ValueError(f"npu_grouped_matmul needs >= 1 group and a limit >= 1, got {groups} and {max_groups}")
    calls = -(-groups // max_groups)
    bounds = [groups * i // calls for i in range(calls + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def npu_grouped_mm(npu, a: torch.Tensor, w: torch.Tensor, ends: torch.Tensor,
                   max_groups: int = NPU_GMM_MAX_GROUPS) -> torch.Tensor:
    """Segment e of ``a`` [M, K] times ``w[e]^T`` (``w`` [E, N, K], ``ends`` [E] the segments' ends)
    with ``npu.npu_grouped_matmul``, without a host synchronisation. The call's contract (torch_npu's
    documentation): one x [M, K] and one weight [G, K, N] (here the transposed view of ``w[g0:g1]``, which
    the op reads as a transposed weight), ``group_list`` int64 [G], the cumulative row counts
    (``group_list_type=0``, non-decreasing), groups along M (``group_type=0``), one output [M, N]
    (``split_item=2``). ``group_list[-1]`` may be below M (at EP > 1 the rows of other ranks' experts
    sort last): those rows' output is undefined and the caller masks them.

    More than ``max_groups`` experts: one call per :func:`npu_gmm_calls` range. A range that starts at
    expert g0 > 0 still has its first group begin at row 0 (a cumulative list starts there), so that
    group computes rows [0, ends[g0]) with expert g0; only rows [ends[g0 - 1], ends[g1 - 1]) of the
    call are kept (a device-side row mask), at the cost of up to M extra rows per additional call."""
    ranges = npu_gmm_calls(w.shape[0], max_groups)
    ends = ends.long()
    out = None
    rows = torch.arange(a.shape[0], device=a.device).unsqueeze(1) if len(ranges) > 1 else None
    for g0, g1 in ranges:
        y = npu.npu_grouped_matmul([a], [w[g0:g1].transpose(1, 2)], group_list=ends[g0:g1], split_item=2,
                                   group_type=0, group_list_type=0)[0]
        if out is None:
            out = y
            continue
        keep = (rows >= ends[g0 - 1]) & (rows < ends[g1 - 1])
        out = torch.where(keep, y, out)
    return out


def _torch_npu():
    try:
        return importlib.import_module("torch_npu")
    except Exception:  # missing or broken CANN install
        return None


class GroupedExperts(nn.Module):
    """This rank's experts as stacked weights: ``gate_up_proj`` [E_local, 2 I/etp, H] (this etp shard
    of G_e stacked on that of U_e) and ``down_proj`` [E_local, H, I/etp] (the matching columns of D_e).

    ``forward(x, counts)`` takes rows already grouped by local expert (``counts[e]`` rows for expert
    e, in order, a host list: one GEMM per expert) and returns each row's expert output (partial over
    etp), in the same order. :meth:`grouped` takes the segment ends as a device tensor instead and runs
    one grouped GEMM per projection. ``gemm`` picks the kernel (None: :func:`expert_gemm_for` the
    input's device and the weights' dtype).
    """

    def __init__(self, num_local: int, hidden_size: int, local_intermediate: int, hidden_act: str, *,
                 dtype: torch.dtype | None = None, device=None, gemm: str | None = None):
        super().__init__()
        if gemm is not None and gemm not in GEMMS:
            raise ValueError(f"gemm={gemm!r} is not one of {GEMMS}")
        self.num_local, self.local_intermediate, self.gemm = num_local, local_intermediate, gemm
        self.hidden_act, self.act = hidden_act, ACTIVATIONS[hidden_act]
        self.gate_up_proj = nn.Parameter(torch.empty(num_local, 2 * local_intermediate, hidden_size,
                                                     dtype=dtype, device=device), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_local, hidden_size, local_intermediate,
                                                  dtype=dtype, device=device), requires_grad=False)
        if gemm is None and self.down_proj.device.type != "meta":
            self.backend(self.down_proj.device)  # refuses float32 experts on CUDA here, at build time

    def forward(self, x: torch.Tensor, counts: list[int], experts: list[int] | None = None) -> torch.Tensor:
        """Rows come in consecutive segments, ``counts[i]`` rows for local expert ``experts[i]``
        (default: segment i is expert i); returns each row's expert output, in the same order.

        One pass over one buffer per projection: each expert's gate/up GEMM writes its rows' slice of
        one [rows, 2 I] buffer, one activation runs over all of it, and each down GEMM writes its
        slice of the output: no per-expert allocation or element-wise call. Equal to
        :meth:`reference` (the same GEMM per segment; element-wise ops do not depend on the split)."""
        inter = self.local_intermediate
        segments = self._segments(counts, experts)
        gate_up = x.new_empty(x.shape[0], 2 * inter)
        for e, start, end in segments:
            torch.mm(x[start:end], self.gate_up_proj[e].t(), out=gate_up[start:end])
        act = gated_halves(self.act, gate_up)
        out = torch.empty_like(x)
        for e, start, end in segments:
            torch.mm(act[start:end], self.down_proj[e].t(), out=out[start:end])
        return out

    def fused_cpu(self, x: torch.Tensor) -> bool:
        """Whether :meth:`weighted_sum` runs vpp's fused CPU kernel for rows like ``x`` here
        (:mod:`vpp.transformer.cpu_ops`: fp32 SiLU experts on an AVX-512 CPU, ``VPP_CPU_OPS``)."""
        return self.backend(x.device) == "loop" and cpu_ops.supports(x, self.gate_up_proj, self.down_proj,
                                                                      self.hidden_act)

    def weighted_sum(self, x: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor,
                     counts: list[int]) -> torch.Tensor:
        """sum over pairs p of ``weights[p] * expert(x[tokens[p]])`` into each token's row ([T, H] fp32),
        the pairs sorted by local expert (``counts[e]`` pairs of expert e), added in pair order: the
        gather, both GEMMs, the activation and the scatter-add in one pass of the fused CPU kernel (call
        :meth:`fused_cpu` first). Equal to ``zeros.index_add_(0, tokens, self(x[tokens], counts) *
        weights)`` up to the GEMMs' summation order."""
        return cpu_ops.experts(x, tokens, weights, counts, list(range(self.num_local)), self.gate_up_proj,
                               self.down_proj)

    def reference(self, x: torch.Tensor, counts: list[int], experts: list[int] | None = None) -> torch.Tensor:
        """:meth:`forward` one expert at a time (each segment's GEMMs and activation on their own):
        what the fused pass is tested against."""
        out = torch.empty_like(x)
        for e, start, end in self._segments(counts, experts):
            rows = x[start:end]
            torch.mm(gated_halves(self.act, F.linear(rows, self.gate_up_proj[e])), self.down_proj[e].t(),
                     out=out[start:end])
        return out

    @staticmethod
    def _segments(counts: list[int], experts: list[int] | None) -> list[tuple[int, int, int]]:
        """(local expert, first row, end row) of each non-empty segment."""
        bounds, start = [], 0
        for e, n in zip(range(len(counts)) if experts is None else experts, counts):
            if n:
                bounds.append((e, start, start + n))
            start += n
        return bounds

    def backend(self, device: torch.device) -> str:
        return self.gemm or expert_gemm_for(device, self.down_proj.dtype)

    def grouped(self, x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """Rows of local expert e are ``x[ends[e-1]:ends[e]]`` (``ends`` [E_local] int, on the device);
        returns their expert outputs. Rows after ``ends[-1]`` belong to no local expert: their output
        is undefined (callers mask them). No host synchronisation."""
        return self._grouped_mm(gated_halves(self.act, self._grouped_mm(x, self.gate_up_proj, ends)),
                                self.down_proj, ends)

    def _grouped_mm(self, a: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """Segment e of ``a`` times ``w[e]^T`` (w [E, N, K], a [rows, K]) -> [rows, N]."""
        if self.backend(a.device) == "npu":
            return npu_grouped_mm(_torch_npu(), a, w, ends, NPU_GMM_MAX_GROUPS)
        return torch._grouped_mm(a, w.transpose(1, 2), offs=ends.int())

    def extra_repr(self) -> str:
        return f"local_experts={self.num_local}, intermediate_shard={self.local_intermediate}"


__all__ = ["GEMMS", "GROUPED_MM_ARCHS", "GROUPED_MM_TORCH", "NPU_GMM_MAX_GROUPS", "GroupedExperts",
           "choose_expert_gemm", "expert_gemm_for", "npu_gmm_calls", "npu_grouped_mm"]
