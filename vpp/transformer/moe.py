"""Mixture of experts with expert parallelism inside a stage's tensor-parallel group.

Y = sum_{e in topk(x)} w_e(x) E_e(x) + S(x): routed SwiGLU experts E_e chosen per token by the
:class:`~vpp.transformer.router.Router`, plus an optional always-on shared expert S.

Where the weights live. The E experts are split over the ``ep`` axis (EP rank r owns experts
[r E/ep, (r+1) E/ep)), and each expert's intermediate dim over the ``etp`` axis (tp = ep x etp;
ep = 1 shards every expert over the whole TP group). The router weight is replicated.

Dispatch (``dispatch=``). The input x [T, H] is replicated over the TP group (it follows
attention's all-reduce), and so is the output.

* ``"allreduce"``: every rank routes all T tokens, runs its local experts (its etp shard of them) on
  the tokens routed there, adds its TP shard of the shared expert, and ONE all-reduce over the TP
  group sums everything. No token moves: each rank already holds them all.
* ``"alltoall"``: EP rank r routes only its 1/ep slice of the tokens (ragged when ep does not divide
  T), sends a copy of each (token, expert) pair to the expert's owner (per-expert counts are
  exchanged first), the owners compute and send results back, r combines them with the routing
  weights and adds the shared expert (sharded over etp like the routed ones, on r's slice), the
  slice is reduced over etp and all-gathered over ep.

Which is cheaper: "allreduce", here and (expected) at TP8 on NVLink/HCCS. ``benchmarks/moe_dispatch.py``
(2 gloo ranks x 1 thread, tp = ep = 2, k = 4; ``benchmarks/results/moe_dispatch.md``) measures
"alltoall" 1.2-2.2x slower than "allreduce" at 64-4096 tokens (median per-round ratio): the input is
already replicated, so the dispatch all-to-all re-sends rows the receiver holds, and both modes do
the same expert FLOPs. Per rank and per layer a ring all-reduce sends 2 (tp-1)/tp x T x H elements;
"alltoall" sends (ep-1)/ep x (2 T k/ep + T) x H (dispatch, combine, all-gather; plus an etp
all-reduce of the slices when etp > 1). With tp = ep that is more whenever k > ep/2 -- 1.5x at
TP8 = EP8 with k = 8 (Qwen3-MoE, DeepSeek-V3, GLM-5) -- and it adds a count exchange that waits on the
host, while all-reduce is the collective NCCL/HCCL optimise best on those fabrics (NVLink SHARP
reduces in the switch). The same runs show experts split over ep beating experts TP-sharded over the
whole group (ep = 1) by 1.0-2.7x on CPU: with ep = 1 every rank gathers and scatters all T x k token
copies. "alltoall" pays off when the input is not replicated (data-parallel attention, sequence
parallelism) or the EP group crosses nodes.

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
loop (one host read of the counts per layer and chunk, with a warning). "alltoall" dispatch needs its split sizes on the host (the collective
takes them as lists): one host synchronisation per layer on every device, a reason more to keep the
default "allreduce".

Loading. Unsharded Hugging Face checkpoints store experts one by one (``experts.{e}.gate_proj.weight``,
``.up_proj.weight``, ``.down_proj.weight``), the router as ``gate.weight`` (+ ``gate.e_score_correction_bias``)
and the shared expert as ``shared_experts.{gate,up,down}_proj.weight``; :meth:`MoE.load_checkpoint`
reads only this rank's experts, and of each only its etp slice, one tensor slice at a time.
"""

from __future__ import annotations

import importlib
import logging
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from vpp.parallel.comm import all_to_all, gather_from_tp, reduce_from_tp
from vpp.parallel.groups import ParallelGroups
from vpp.transformer.mlp import DenseMLP
from vpp.transformer.moe_config import ACTIVATIONS, MoEConfig
from vpp.transformer.router import Router
from vpp.parallel.sharding import ReadSlice, Shard, SliceLoader

log = logging.getLogger(__name__)

DISPATCH = ("allreduce", "alltoall")
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
        self.act = ACTIVATIONS[hidden_act]
        self.gate_up_proj = nn.Parameter(torch.empty(num_local, 2 * local_intermediate, hidden_size,
                                                     dtype=dtype, device=device), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_local, hidden_size, local_intermediate,
                                                  dtype=dtype, device=device), requires_grad=False)
        if gemm is None and self.down_proj.device.type != "meta":
            self.backend(self.down_proj.device)  # refuses float32 experts on CUDA here, at build time

    def forward(self, x: torch.Tensor, counts: list[int], experts: list[int] | None = None) -> torch.Tensor:
        """Rows come in consecutive segments, ``counts[i]`` rows for local expert ``experts[i]``
        (default: segment i is expert i); returns each row's expert output, in the same order."""
        out = torch.empty_like(x)
        start = 0
        for e, n in zip(range(len(counts)) if experts is None else experts, counts):
            if n == 0:
                continue
            rows = x[start:start + n]
            gate, up = F.linear(rows, self.gate_up_proj[e]).chunk(2, dim=-1)
            torch.mm(self.act(gate).mul_(up), self.down_proj[e].t(), out=out[start:start + n])
            start += n
        return out

    def backend(self, device: torch.device) -> str:
        return self.gemm or expert_gemm_for(device, self.down_proj.dtype)

    def grouped(self, x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """Rows of local expert e are ``x[ends[e-1]:ends[e]]`` (``ends`` [E_local] int, on the device);
        returns their expert outputs. Rows after ``ends[-1]`` belong to no local expert: their output
        is undefined (callers mask them). No host synchronisation."""
        gate, up = self._grouped_mm(x, self.gate_up_proj, ends).chunk(2, dim=-1)
        return self._grouped_mm(self.act(gate).mul_(up), self.down_proj, ends)

    def _grouped_mm(self, a: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """Segment e of ``a`` times ``w[e]^T`` (w [E, N, K], a [rows, K]) -> [rows, N]."""
        if self.backend(a.device) == "npu":
            return npu_grouped_mm(_torch_npu(), a, w, ends, NPU_GMM_MAX_GROUPS)
        return torch._grouped_mm(a, w.transpose(1, 2), offs=ends.int())

    def extra_repr(self) -> str:
        return f"local_experts={self.num_local}, intermediate_shard={self.local_intermediate}"


class MoE(nn.Module):
    """Routed experts over ``groups.ep`` x ``groups.etp`` plus an optional shared expert; see the
    module docstring for the two ``dispatch`` modes. ``forward(x [T, H]) -> [T, H]``, input and output
    replicated over the TP group."""

    def __init__(self, cfg: MoEConfig, groups: ParallelGroups, *, dispatch: str = "allreduce",
                 dtype: torch.dtype | None = None, device=None, gemm: str | None = None):
        super().__init__()
        if dispatch not in DISPATCH:
            raise ValueError(f"dispatch={dispatch!r} is not one of {DISPATCH}")
        ep, etp = groups.ep.size, groups.etp.size
        if cfg.num_experts % ep:
            raise ValueError(f"num_experts={cfg.num_experts} is not divisible by ep={ep}")
        if cfg.moe_intermediate_size % etp:
            raise ValueError(f"moe_intermediate_size={cfg.moe_intermediate_size} is not divisible by etp={etp}")
        self.cfg, self.groups, self.dispatch = cfg, groups, dispatch
        self.num_local = cfg.num_experts // ep
        self.first_expert = groups.ep.rank * self.num_local
        self.gate = Router(cfg, dtype=dtype, device=device)
        self.experts = GroupedExperts(self.num_local, cfg.hidden_size, cfg.moe_intermediate_size // etp,
                                      cfg.hidden_act, dtype=dtype, device=device, gemm=gemm)
        self.shared_experts = None
        if cfg.shared_intermediate_size:
            # allreduce: sharded over the TP group like any MLP; alltoall: over etp, on this rank's slice
            shared_group = groups.tp if dispatch == "allreduce" else groups.etp
            self.shared_experts = DenseMLP(cfg.hidden_size, cfg.shared_intermediate_size, shared_group,
                                           hidden_act=cfg.hidden_act, reduce_output=False, dtype=dtype, device=device)

    # --- forward ---------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0:  # T is the same on every TP rank, so all skip the collectives together
            return torch.zeros_like(x)
        if self.dispatch == "allreduce":
            return self._forward_allreduce(x)
        return self._forward_alltoall(x)

    def _forward_allreduce(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        if x.shape[0] == 1 and self.experts.backend(x.device) == "loop":
            return self._one_token(x, weights, ids)
        if self.experts.backend(x.device) == "loop":
            tokens, y = self._local_pairs_loop(x, weights, ids)
        else:
            tokens, y = self._local_pairs_grouped(x, weights, ids)
        out = torch.zeros_like(x).index_add_(0, tokens, y.to(x.dtype))
        if self.shared_experts is not None:
            out += self.shared_experts(x)
        return reduce_from_tp(out, self.groups.tp)

    def _one_token(self, x, weights, ids):
        """One token (a decode step of one request) on the loop backend: its top-k experts straight
        from the router's ids (one host read), summed in expert order as the general path's
        ``index_add_`` sums them; no sorting, counting or gathering."""
        out = torch.zeros_like(x)
        experts = self.experts
        for w, e in sorted(zip(weights[0].tolist(), ids[0].tolist()), key=lambda p: p[1]):
            e -= self.first_expert
            if 0 <= e < self.num_local:
                gate, up = F.linear(x, experts.gate_up_proj[e]).chunk(2, dim=-1)
                out += F.linear(experts.act(gate).mul_(up), experts.down_proj[e]).mul_(w).to(x.dtype)
        if self.shared_experts is not None:
            out += self.shared_experts(x)
        return reduce_from_tp(out, self.groups.tp)

    def _local_pairs_loop(self, x, weights, ids):
        """The reference: this rank's (token, expert) pairs picked out and counted on the host
        (``nonzero``, ``tolist``: CPU only, where they cost no device synchronisation)."""
        local = ids - self.first_expert
        pairs = ((local >= 0) & (local < self.num_local)).flatten().nonzero().squeeze(1)  # CPU only: sized on the host
        expert = local.flatten()[pairs]
        order = torch.argsort(expert, stable=True)
        pairs, expert = pairs[order], expert[order]
        counts = torch.bincount(expert, minlength=self.num_local).tolist()  # CPU only: a host read
        tokens = pairs // self.cfg.top_k
        return tokens, self.experts(x.index_select(0, tokens), counts).mul_(weights.flatten()[pairs].unsqueeze(1))

    def _local_pairs_grouped(self, x, weights, ids):
        """Every (token, expert) pair, sorted by local expert; pairs of other ranks' experts sort last,
        into a segment no GEMM reads, and are zeroed. Static shapes, no host synchronisation."""
        local = (ids - self.first_expert).flatten()
        outside = (local < 0) | (local >= self.num_local)
        expert = local.masked_fill(outside, self.num_local)
        order = torch.argsort(expert, stable=True)
        expert = expert[order]
        bounds = torch.arange(self.num_local, device=x.device, dtype=expert.dtype)
        ends = torch.searchsorted(expert, bounds, right=True)  # rows of local experts 0..e
        tokens = order // self.cfg.top_k
        y = self.experts.grouped(x.index_select(0, tokens), ends)
        y = y.masked_fill_(outside[order].unsqueeze(1), 0.0)  # undefined rows: not this rank's experts
        return tokens, y.mul_(weights.flatten()[order].unsqueeze(1))

    def _forward_alltoall(self, x: torch.Tensor) -> torch.Tensor:
        ep, k = self.groups.ep, self.cfg.top_k
        sizes = token_split(x.shape[0], ep.size)
        start = sum(sizes[:ep.rank])
        mine = x[start:start + sizes[ep.rank]]
        weights, ids = self.gate(mine)
        # (token, expert) pairs sorted by expert: grouped by owner, then by the owner's local expert
        order = torch.argsort(ids.flatten(), stable=True)
        tokens = order // k
        sent = torch.bincount(ids.flatten(), minlength=self.cfg.num_experts).view(ep.size, self.num_local)
        received = all_to_all(sent, ep, [1] * ep.size, [1] * ep.size)  # [source, local expert]
        # alltoall only: the collective takes its split sizes as host lists (a host read on any device;
        # the default "allreduce" dispatch has none)
        send_splits, recv_splits = sent.sum(1).tolist(), received.sum(1).tolist()
        rows = all_to_all(mine.index_select(0, tokens), ep, send_splits, recv_splits)
        # rows arrive grouped by source, then by local expert: run them segment by segment, in place
        y = self.experts(rows, received.flatten().tolist(), list(range(self.num_local)) * ep.size)  # host list, as above
        y = all_to_all(y, ep, recv_splits, send_splits).mul_(weights.flatten()[order].unsqueeze(1))
        out = torch.zeros_like(mine).index_add_(0, tokens, y.to(x.dtype))
        if self.shared_experts is not None:
            out += self.shared_experts(mine)
        out = reduce_from_tp(out, self.groups.etp)
        return gather_rows(out, sizes, ep)

    # --- loading ---------------------------------------------------------------------------------
    def local_experts(self) -> range:
        """Global ids of the experts this rank holds."""
        return range(self.first_expert, self.first_expert + self.num_local)

    def checkpoint_names(self, prefix: str = "") -> list[str]:
        """Every checkpoint tensor this rank reads (names as in the unsharded HF checkpoint)."""
        names = [f"{prefix}gate.weight"]
        if self.cfg.correction_bias:
            names.append(f"{prefix}gate.e_score_correction_bias")
        for e in self.local_experts():
            names += [f"{prefix}experts.{e}.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
        if self.shared_experts is not None:
            names += self.shared_experts.checkpoint_names(f"{prefix}shared_experts.")
        return names

    def load_checkpoint(self, read: ReadSlice, prefix: str = "") -> None:
        """Load this rank's router, experts and shared-expert shard: ``read(prefix + name, shard)``
        gives the rows (gate, up) or columns (down) of its etp slice of each local expert, copied in
        place before the next slice is read. Only this rank's experts are read; missing tensors raise
        a KeyError naming them all."""
        cfg, etp = self.cfg, self.groups.etp
        loader = SliceLoader(read, f"MoE at {prefix!r}")
        loader.copy(self.gate.weight, f"{prefix}gate.weight")
        if cfg.correction_bias:
            loader.copy(self.gate.e_score_correction_bias, f"{prefix}gate.e_score_correction_bias")
        rows, cols = Shard(0, etp.rank, etp.size), Shard(1, etp.rank, etp.size)
        inter = self.experts.local_intermediate
        for i, e in enumerate(self.local_experts()):
            name = f"{prefix}experts.{e}."
            loader.copy(self.experts.gate_up_proj[i, :inter], f"{name}gate_proj.weight", rows)
            loader.copy(self.experts.gate_up_proj[i, inter:], f"{name}up_proj.weight", rows)
            loader.copy(self.experts.down_proj[i], f"{name}down_proj.weight", cols)
        if self.shared_experts is not None:
            self.shared_experts.load_into(loader, f"{prefix}shared_experts.")
        loader.finish()

    def extra_repr(self) -> str:
        g = self.groups
        first, end = self.first_expert, self.first_expert + self.num_local
        return (f"dispatch={self.dispatch}, experts=[{first}, {end}) of {self.cfg.num_experts}, "
                f"ep={g.ep.rank}/{g.ep.size}, etp={g.etp.rank}/{g.etp.size}")


def token_split(tokens: int, parts: int) -> list[int]:
    """Balanced contiguous split: the first ``tokens % parts`` parts get one token more."""
    return [tokens // parts + (1 if i < tokens % parts else 0) for i in range(parts)]


def gather_rows(x: torch.Tensor, sizes: list[int], group) -> torch.Tensor:
    """All-gather ragged row blocks (rank i holds ``sizes[i]`` rows) into one tensor in rank order."""
    if group.size == 1:
        return x
    longest = max(sizes)
    padded = x.new_zeros((longest, *x.shape[1:]))
    padded[:x.shape[0]] = x
    parts = gather_from_tp(padded, group, dim=0).split(longest)
    return torch.cat([part[:n] for part, n in zip(parts, sizes)])


__all__ = ["MoE", "MoEConfig", "DenseMLP", "GroupedExperts", "Router", "token_split", "gather_rows", "DISPATCH"]
