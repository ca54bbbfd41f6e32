"""How real runs cut a model into stages: balanced per rank on the cost model's per-layer times.

For a run of ``chunk``-token chunks over a ``seq_len``-token prompt, every layer is costed by the
deployment cost model (:class:`vpp.perf.DeploymentCost`, the "cpu" preset unless a device is given) at
the middle of the prompt (``prefix = seq_len / 2``), with the embedding and the final norm and LM head
costed as the first and last stage carry them; :func:`vpp.plan.make_layout` (``per_rank=True``) then
minimises the heaviest rank, cutting only where the model allows a stage to start. A model the cost
model cannot read (the toy model) keeps the even split of :func:`vpp.models.snap_partition`.
"""

from __future__ import annotations

from vpp.config import ConfigError
from vpp.models.registry import ModelSource, snap_partition
from vpp.perf.arch import Arch
from vpp.perf.deployment import DeploymentCost
from vpp.perf.hardware import Device, get_device
from vpp.perf.ops import Parallel, embed_ops, head_ops
from vpp.plan import make_layout
from vpp.plan.layout import stage_ranks_for

PARTITIONS = ("rank", "even")


def layer_costs(config: dict, *, chunk: int, seq_len: int, device: Device | None = None,
                par: Parallel | None = None) -> tuple[list[float], float, float]:
    """(per-layer seconds, embedding seconds, head seconds) of one chunk at the middle of the prompt."""
    arch = Arch.from_config(config)
    device = device or get_device("cpu")
    par = par or Parallel()
    cost = DeploymentCost(arch, device, make_layout("loop", arch.layers, 1), par)
    prefix = max(0, seq_len // 2 - chunk // 2)
    per_layer = [cost.layer_time(i, chunk, prefix) for i in range(arch.layers)]
    embed = sum(device.op_time(op) for op in embed_ops(arch, chunk, par))
    head = sum(device.op_time(op) for op in head_ops(arch, chunk, par))
    return per_layer, embed, head


def choose_partition(model: ModelSource, kind: str, pp: int, folds: int = 1, *, chunk: int, seq_len: int,
                     how: str = "rank", device: Device | None = None) -> list[int]:
    """Layers per stage for ``model`` on a ``kind`` layout (see the module docstring)."""
    if how not in PARTITIONS:
        raise ValueError(f"partition={how!r}; expected one of {PARTITIONS}")
    stages = len(stage_ranks_for(kind, pp, folds))
    if how == "even":
        return snap_partition(model.num_layers, stages, model.stage_starts)
    try:
        costs, embed, head = layer_costs(model.config, chunk=chunk, seq_len=seq_len, device=device)
    except (ConfigError, KeyError):
        return snap_partition(model.num_layers, stages, model.stage_starts)
    layout = make_layout(kind, model.num_layers, pp, folds=folds, layer_costs=costs, embed_cost=embed,
                         head_cost=head, per_rank=True, allowed_starts=model.stage_starts)
    return list(layout.partition)
