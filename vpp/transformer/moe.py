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
  slice is reduced over etp and all-gathered over ep. With the grouped expert GEMM (CUDA, NPU) the
  all-to-alls are fixed-capacity (:meth:`MoE._forward_alltoall_fixed`): every rank sends every peer a
  block of ``ceil(T/ep) k`` rows (the most it could route there), the pairs' places and local expert
  ids computed on the device, so the host never reads a count (the ragged all-to-all takes its split
  sizes as host lists: one host wait per layer and chunk); the price is up to ep x the rows on the
  wire. On CPU, where a host read is free, the ragged exchange stays (the reference).

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

Expert GEMMs (which kernel, and why no host synchronisation): :mod:`vpp.transformer.expert_gemm`.

Loading. Unsharded Hugging Face checkpoints store experts one by one (``experts.{e}.gate_proj.weight``,
``.up_proj.weight``, ``.down_proj.weight``), the router as ``gate.weight`` (+ ``gate.e_score_correction_bias``)
and the shared expert as ``shared_experts.{gate,up,down}_proj.weight``; :meth:`MoE.load_checkpoint`
reads only this rank's experts, and of each only its etp slice, one tensor slice at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vpp.parallel.comm import all_to_all, gather_from_tp, reduce_from_tp
from vpp.parallel.groups import ParallelGroups
from vpp.transformer.expert_gemm import GroupedExperts
from vpp.transformer.mlp import DenseMLP
from vpp.transformer.moe_config import MoEConfig
from vpp.transformer.router import Router
from vpp.parallel.sharding import ReadSlice, Shard, SliceLoader

DISPATCH = ("allreduce", "alltoall")


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
        if self.experts.fused_cpu(x):  # vpp's fused CPU kernel: gather, GEMMs, activation, scatter in one pass
            out = self.experts.weighted_sum(x, *self._sorted_local_pairs(weights, ids))
        else:
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

    def _sorted_local_pairs(self, weights, ids):
        """This rank's (token, expert) pairs picked out, sorted by local expert (stable) and counted on
        the host (``nonzero``, ``tolist``: CPU only, where they cost no device synchronisation):
        (each pair's token, its routing weight, the pairs of each local expert)."""
        local = ids - self.first_expert
        pairs = ((local >= 0) & (local < self.num_local)).flatten().nonzero().squeeze(1)  # CPU only: sized on the host
        expert = local.flatten()[pairs]
        order = torch.argsort(expert, stable=True)
        pairs, expert = pairs[order], expert[order]
        counts = torch.bincount(expert, minlength=self.num_local).tolist()  # CPU only: a host read
        return pairs // self.cfg.top_k, weights.flatten()[pairs], counts

    def _local_pairs_loop(self, x, weights, ids):
        """The reference: one GEMM per local expert and projection over the gathered rows."""
        tokens, w, counts = self._sorted_local_pairs(weights, ids)
        return tokens, self.experts(x.index_select(0, tokens), counts).mul_(w.unsqueeze(1))

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
        if self.experts.backend(x.device) != "loop":
            return self._forward_alltoall_fixed(x)
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

    def _forward_alltoall_fixed(self, x: torch.Tensor) -> torch.Tensor:
        """"alltoall" with fixed-capacity exchanges: every shape follows from T, nothing is read on the
        host (see the module docstring). Pair p of this rank (sorted by expert, so grouped by owner)
        goes to row ``owner * cap + its place among the owner's pairs``; its local expert id travels
        beside it (``num_local`` marks an empty row, which sorts after every expert and is zeroed)."""
        ep, k, n_local = self.groups.ep, self.cfg.top_k, self.num_local
        sizes = token_split(x.shape[0], ep.size)
        start = sum(sizes[:ep.rank])
        mine = x[start:start + sizes[ep.rank]]
        weights, ids = self.gate(mine)
        cap, flat = max(sizes) * k, ids.flatten()
        order = torch.argsort(flat, stable=True)
        expert = flat[order]
        owner = torch.div(expert, n_local, rounding_mode="floor")
        counts = torch.bincount(owner, minlength=ep.size)
        place = torch.arange(flat.numel(), device=x.device) - (torch.cumsum(counts, 0) - counts)[owner]
        dest = owner * cap + place
        rows = mine.new_zeros((ep.size * cap, mine.shape[1]))
        rows[dest] = mine.index_select(0, order // k)
        local = torch.full((ep.size * cap, 1), n_local, dtype=flat.dtype, device=x.device)
        local[dest, 0] = expert - owner * n_local
        even = [cap] * ep.size
        rows, local = all_to_all(rows, ep, even, even), all_to_all(local, ep, even, even).squeeze(1)
        by_expert = torch.argsort(local, stable=True)
        ends = torch.searchsorted(local[by_expert], torch.arange(n_local, device=x.device, dtype=local.dtype),
                                  right=True)
        y = torch.empty_like(rows)
        y[by_expert] = self.experts.grouped(rows.index_select(0, by_expert), ends)
        y.masked_fill_((local == n_local).unsqueeze(1), 0.0)  # empty rows: no expert ran them
        y = all_to_all(y, ep, even, even)[dest].mul_(weights.flatten()[order].unsqueeze(1))
        out = torch.zeros_like(mine).index_add_(0, order // k, y.to(x.dtype))
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
