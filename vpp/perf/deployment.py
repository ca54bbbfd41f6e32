"""The deployment cost model: a model's architecture on a device, split into stages by a layout.

:class:`DeploymentCost` implements the simulator's cost protocol (:mod:`vpp.schedules.cost`):

* ``compute(stage, tokens, prefix)`` -- every op of the stage's layers (``layout.stage_layers``) for a
  chunk of ``tokens`` after ``prefix`` cached tokens, on one rank of the stage's TP group, including the
  TP collectives inside the stage; the embedding on stage 0, the final norm and last-token logits on the
  last stage; plus ``device.step_overhead`` per call; plus, with ``sync_steps`` (a runner that
  synchronises the device before every step, as vLLM-Ascend's DCPP does while it times steps for its
  online calibration), ``device.host_step`` of device idle per call, booked as ``launch_stall``;
* ``transfer(tokens)`` -- one PP hand-over: each of the ``tp`` ranks sends its 1/tp slice of the
  activation (``pp_tensors`` tensors of width hidden) and the receiving group all-gathers it (vLLM's
  ``send_tensor_dict(..., all_gather_group=tp_group)``);
* ``overlap`` -- ``device.pp_overlap``;
* ``step_compute(stage, shapes)`` -- the pieces of one step shared by requests: each its own call
  (as ``compute``, the per-step overhead paid once), or with ``batched_steps`` one forward on the step's
  tokens, attention per piece (:mod:`.batched`), its time shared among the pieces.

``breakdown(stage, tokens, prefix)`` splits ``compute`` into the op categories of :mod:`.ops` plus
``launch`` (kernel launches) and ``step`` (per-call overhead); ``tp_comm`` is the part the paper's
profiler counts as communication rather than computation (see :mod:`.decompose`).

The times of a layer and of the ends on a chunk come from :mod:`.op_cache` (computed once per process
for equal (arch, device, par), the same floats as afresh); an instance keeps its stages' sums per
(stage, tokens, prefix).
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

from vpp.schedules.cost import separate_calls

from . import batched, op_cache
from .arch import Arch
from .hardware import Device
from .ops import Parallel, pp_message_bytes


class DeploymentCost:
    def __init__(self, arch: Arch, device: Device, layout, par: Parallel | None = None, *,
                 overlap: float | None = None, sync_steps: bool = False, sync_only: set | None = None,
                 batched_steps: bool = False):
        if layout.num_layers != arch.layers:
            raise ValueError(f"layout has {layout.num_layers} layers but {arch.name} has {arch.layers}")
        self.arch, self.device, self.layout = arch, device, layout
        self.sync_steps = bool(sync_steps)
        self.batched_steps = bool(batched_steps)
        self.sync_only = sync_only
        self.par = par or Parallel()
        self.overlap = device.pp_overlap if overlap is None else float(overlap)
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap={self.overlap} must lie in [0, 1]")
        # layers of each kind (MoE or not, own DSA indexer or not) per stage, and one layer of each kind
        self._example = {}
        for i in range(arch.layers):
            self._example.setdefault(arch.layer_kind(i), i)
        self._counts = []
        for s in range(layout.num_stages):
            counts: dict = defaultdict(int)
            for i in layout.layers_of(s):
                counts[arch.layer_kind(i)] += 1
            self._counts.append(dict(counts))
        self._layer = lru_cache(maxsize=65536)(self._layer_breakdown)
        self.config_id = op_cache.config_id(arch, device, self.par)
        self._kinds = [tuple((self._example[kind], n) for kind, n in counts.items()) for counts in self._counts]
        self._stage_parts: dict = {}   # (stage, tokens, prefix) -> its layers and ends (no per-call terms)

    def __repr__(self) -> str:
        return (f"DeploymentCost({self.arch.name} on {self.device.name}, tp={self.par.tp}, ep={self.par.ep}, "
                f"{self.layout.describe()})")

    # -- pieces ---------------------------------------------------------------------------------------
    def ops_breakdown(self, ops) -> dict:
        """Seconds per category of ``ops`` on this device, kernel launches apart (``launch``)."""
        return op_cache.ops_breakdown(self.device, ops)

    def _layer_breakdown(self, kind: tuple, tokens: int, prefix: int) -> dict:
        """Seconds per category of one layer of ``kind`` on a chunk (shared: read, never changed)."""
        return op_cache.layer_parts(self.config_id, self._example[kind], tokens, prefix)

    def layer_kinds(self, stage: int) -> list[tuple[int, int]]:
        """The layers of ``stage`` by kind: (a layer of the kind, how many of the stage's layers it stands for)."""
        return list(self._kinds[stage])

    def syncs(self, shape: tuple[int, int]) -> bool:
        """Whether the runner synchronises the device before a step (a call) led by a chunk of this
        (tokens, prefix): every step with ``sync_steps``, or only the shapes in ``sync_only`` when given."""
        return bool(self.sync_steps and self.device.host_step and (self.sync_only is None or shape in self.sync_only))

    def layer_breakdown(self, layer: int, tokens: int, prefix: int) -> dict:
        return dict(self._layer(self.arch.layer_kind(layer), int(tokens), int(prefix)))

    def layer_time(self, layer: int, tokens: int, prefix: int) -> float:
        return sum(self.layer_breakdown(layer, tokens, prefix).values())

    # -- the simulator protocol -----------------------------------------------------------------------
    def breakdown(self, stage: int, tokens: int, prefix: int) -> dict:
        """Seconds per category for one call of ``compute``."""
        if not 0 <= stage < self.layout.num_stages:
            raise ValueError(f"stage {stage} outside 0..{self.layout.num_stages - 1}")
        tokens, prefix = int(tokens), int(prefix)
        parts = self._stage_parts.get((stage, tokens, prefix))
        if parts is None:
            parts = self._stage_parts[(stage, tokens, prefix)] = self._stage_sum(stage, tokens, prefix)
        out = dict(parts)
        if self.device.step_overhead:
            out["step"] = out.get("step", 0.0) + self.device.step_overhead
        if self.syncs((tokens, prefix)):
            out["launch_stall"] = out.get("launch_stall", 0.0) + self.device.host_step
        return out

    def _stage_sum(self, stage: int, tokens: int, prefix: int) -> dict:
        """The stage's layers, then the embedding (stage 0) and the head (last stage) on the stage's local
        tokens: seconds per category."""
        out: dict = defaultdict(float)
        for kind, n in self._counts[stage].items():
            for k, v in self._layer(kind, tokens, prefix).items():
                out[k] += n * v
        for parts in op_cache.ends_parts(self.config_id, self.local_tokens(tokens), stage == 0,
                                         stage == self.layout.last_stage):
            for k, v in parts:
                out[k] += v
        return dict(out)

    def compute(self, stage: int, tokens: int, prefix: int) -> float:
        return sum(self.breakdown(stage, tokens, prefix).values())

    def step_compute(self, stage: int, shapes) -> list[float]:
        """Seconds of each piece of one step shared by requests (``shapes``: the pieces' (tokens, prefix),
        lead first): with ``batched_steps`` the step is one forward whose time the pieces share
        (:func:`.batched.piece_times`), else each piece is its own call (:func:`vpp.schedules.cost.separate_calls`)."""
        shapes = [(int(t), int(p)) for t, p in shapes]
        if self.batched_steps and len(shapes) > 1:
            return batched.piece_times(self, stage, shapes)
        return separate_calls(self, stage, shapes)

    def overhead(self, stage: int) -> float:
        """What a stage call pays whatever its tokens: ``device.step_overhead``, and ``host_step`` when
        every call synchronises (a step shared by requests pays it once, :func:`vpp.schedules.cost.step_overhead`)."""
        sync = self.sync_steps and self.device.host_step and self.sync_only is None
        return float(self.device.step_overhead or 0.0) + (float(self.device.host_step) if sync else 0.0)

    def local_tokens(self, tokens: int) -> int:
        """Tokens of a chunk that one device of the stage holds (all of them; context parallelism
        shards them, :class:`vpp.perf.cp.ContextParallelCost`)."""
        return int(tokens)

    def transfer(self, tokens: int) -> float:
        msg = pp_message_bytes(self.arch, self.local_tokens(tokens), self.par)
        tp = self.par.tp
        if tp == 1:
            return self.device.pp_p2p(msg)
        return self.device.pp_p2p(msg / tp) + self.device.allgather(msg, tp)


__all__ = ["DeploymentCost"]
