"""The memory a real run will need per rank, planned before any rank starts, and whether it fits.

For one rank of a prefill (and the decoding after it) on the runtime's models:

* weights -- given by the caller (the parameter bytes of the rank's stages built on the meta device: exact),
  or else :func:`vpp.perf.rank_memory.layer_weight_bytes` per layer plus the vocab-parallel embedding and head;
* KV cache -- every request's caches are reserved once at ``prompt + new tokens`` (the executor's
  ``reserve``): ``tokens x layers on the rank x`` the cached values per token and layer
  (:func:`vpp.perf.rank_memory.kv_bytes_per_token_layer`: GQA's K and V of the rank's KV heads, MLA's latent
  plus rope key, DSA's index key), in the run's dtype;
* activations -- what one compute holds at once, which depends on the chunk, not on the prompt: the
  attention workspace (MLA's expanded prefix keys and DSA's scores are computed in blocks sized to a byte
  budget, ``vpp.transformer.attention.workspace``: 32 MiB on a CPU, 1/64 of an accelerator's memory), the
  layer's working set (:func:`vpp.perf.rank_memory.working_set` at prefix 0: four hidden-sized buffers and the
  MLP's or the routed experts' intermediate), and ``IN_FLIGHT`` chunk outputs held as send or receive
  buffers or local hand-offs (the transfer probe before the run is one of them); plus the prompt's token
  ids (int64) on the rank that feeds stage 0. Every chunk-sized buffer is sized by :func:`planned_chunk`
  (a chunk never exceeds the prompt), in the plan and in the run alike.

On a CPU the ranks also carry the interpreter and its libraries (``runtime``: measured by the caller as
the resident set of a process that imported torch), and every co-located rank draws on the same machine
memory and cgroup limit. On an accelerator each rank has its card's memory to itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .arch import Arch
from .rank_memory import kv_bytes_per_token_layer, layer_weight_bytes, working_set
from .ops import Parallel

CPU_WORKSPACE = 32 << 20   # vpp.transformer.attention.workspace.CPU_BUDGET (perf may not import torch code)
DEVICE_WORKSPACE_SHARE = 64
IN_FLIGHT = 2              # chunk outputs resident at once beside the compute (a send and a receive)
MIB = 2 ** 20


@dataclass(frozen=True)
class RankMemoryPlan:
    rank: int
    weights: int
    kv_cache: int
    activations: int
    runtime: int = 0  # the process itself (CPU ranks): interpreter, torch

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations + self.runtime

    def to_dict(self) -> dict:
        return dict(asdict(self), total=self.total)

    def describe(self) -> str:
        parts = [f"weights {self.weights / MIB:.1f}", f"KV cache {self.kv_cache / MIB:.1f}",
                 f"activations {self.activations / MIB:.1f}"] + ([f"runtime {self.runtime / MIB:.0f}"] if self.runtime else [])
        return f"rank {self.rank}: {self.total / MIB:.1f} MiB (" + ", ".join(parts) + ")"


def planned_chunk(chunk: int, tokens: int) -> int:
    """The largest chunk a run of ``tokens``-token prompts cut into ``chunk``-token chunks forms: what the
    plan sizes every chunk-sized buffer by, and what the run allocates them with (the transfer probe, a
    DCPP planner's profiling budget, send and receive buffers), so that no buffer exceeds the plan."""
    return max(1, min(int(chunk), int(tokens)))


def plan_memory(arch: Arch, rank_layers: list[list[int]], *, tp: int, dtype_bytes: int, tokens: int, chunk: int,
                first_rank: int = 0, last_rank: int | None = None, weights: list[int] | None = None,
                workspace_bytes: int = CPU_WORKSPACE, runtime: int = 0, ep: int | None = None,
                cp: int = 1) -> list[RankMemoryPlan]:
    """One :class:`RankMemoryPlan` per pipeline rank (``rank_layers[r]``: the global layers its stages
    hold). ``tokens``: the longest request's prompt plus new tokens; ``chunk``: the largest chunk.

    ``cp``: context-parallel ranks per stage (each planned here, they are alike): a rank caches its
    own share of the tokens only, ``ceil(tokens / cp) + 2 cp`` rows (what ``Stage.reserve`` reserves),
    computes its share of each chunk (two pieces of ``ceil(chunk / 2cp)``), and holds transiently one
    layer's K/V of every rank (the all-gather method; a ring holds two blocks)."""
    par = Parallel(tp=tp, ep=ep, act_bytes=dtype_bytes, weight_bytes=dtype_bytes, kv_bytes=dtype_bytes, pp_tensors=1)
    per_token = kv_bytes_per_token_layer(arch, par)
    chunk = planned_chunk(chunk, tokens)
    if cp < 1:
        raise ValueError(f"cp={cp} must be >= 1")
    share = tokens if cp == 1 else -(-tokens // cp) + 2 * cp
    gathered = 0 if cp == 1 else per_token * tokens
    chunk = chunk if cp == 1 else 2 * -(-chunk // (2 * cp))
    out = []
    for r, layers in enumerate(rank_layers):
        if weights is not None:
            w = int(weights[r])
        else:
            vocab = arch.vocab / tp * arch.hidden * dtype_bytes
            w = int(sum(layer_weight_bytes(arch, i, par) for i in layers) + vocab * (r == first_rank)
                    + vocab * (r == (last_rank if last_rank is not None else len(rank_layers) - 1)))
        kv = int(per_token * len(layers) * share)
        act = workspace_bytes + working_set(arch, par, chunk, 0) + IN_FLIGHT * chunk * arch.hidden * dtype_bytes
        act += gathered
        act += 8 * tokens if r == first_rank else 0
        out.append(RankMemoryPlan(r, w, kv, int(act), runtime))
    return out


def shortfall(plans: list[RankMemoryPlan], available: int, *, shared: bool) -> str | None:
    """None when the ranks fit ``available`` bytes (``shared``: all of them together, as co-located CPU
    ranks; else each rank alone, as one card per rank); else the figures, in one line."""
    need = sum(p.total for p in plans) if shared else max(p.total for p in plans)
    if need <= available:
        return None
    busiest = max(plans, key=lambda p: p.total)
    what = f"{len(plans)} ranks need {need / MIB:.0f} MiB together" if shared else \
        f"rank {busiest.rank} needs {need / MIB:.0f} MiB"
    return f"{what}, {available / MIB:.0f} MiB available; busiest {busiest.describe()}"


__all__ = [
    "CPU_WORKSPACE", "DEVICE_WORKSPACE_SHARE", "IN_FLIGHT", "MIB", "RankMemoryPlan", "plan_memory",
    "planned_chunk", "shortfall",
]
