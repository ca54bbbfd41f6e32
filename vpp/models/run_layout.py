"""The choice of a run's layout, made once per run (:func:`layout_for`): the strategy's layout kind, its
stages even (as the model's allowed stage starts permit) or balanced per rank on the cost model's
per-layer times. The commands choose it in their own process, check it, and pass it down to the ranks.

For a run of ``chunk``-token chunks over a ``seq_len``-token prompt, every layer is costed by the
deployment cost model (:class:`vpp.perf.DeploymentCost`, the "cpu" preset unless a device is given) at
the middle of the prompt (``prefix = seq_len / 2``), with the embedding and the final norm and LM head
costed as the first and last stage carry them; :func:`vpp.schedules.make_layout` (``per_rank=True``) then
minimises the heaviest rank, cutting only where the model allows a stage to start. Given the
schedule, the partitions that tie on the heaviest rank are then told apart on the whole prompt: each
is simulated with the cost model's per-layer time at every chunk's prefix
(:func:`vpp.schedules.drain_balance.fastest_partition`) and the fastest wins -- on a V this moves rank 0's
work out of the drain (the last stage of the last chunk) into the fill (tiny-deepseek, 8 chunks: six
layers as 2/1/2/1 rather than 1/1/2/2). A model the cost model cannot read (the toy model) keeps the
even split of :func:`vpp.models.snap_partition`.
"""

from __future__ import annotations

from vpp.config import ConfigError
from vpp.models.registry import ModelSource, snap_partition
from vpp.perf.arch import Arch
from vpp.perf.deployment import DeploymentCost
from vpp.perf.hardware import Device, get_device
from vpp.perf.ops import Parallel, embed_ops, head_ops
from vpp.schedules import make_layout, strategies
from vpp.schedules.drain_balance import fastest_partition
from vpp.schedules.layout import stage_ranks_for
from vpp.schedules.rank_balance import balanced_candidates

PARTITIONS = ("rank", "even")


def layer_costs(config: dict, *, chunk: int, seq_len: int, device: Device | None = None,
                par: Parallel | None = None) -> tuple[list[float], float, float]:
    """(per-layer seconds, embedding seconds, head seconds) of one chunk at the middle of the prompt."""
    time_of = ChunkTime(config, device=device, par=par)
    prefix = max(0, seq_len // 2 - chunk // 2)
    per_layer = [time_of.layer(i, chunk, prefix) for i in range(time_of.arch.layers)]
    return per_layer, time_of.embed(chunk, prefix), time_of.head(chunk, prefix)


def layout_for(model: ModelSource, schedule: str, pp: int, folds: int = 1, *, chunk: int | None = None,
               seq_len: int | None = None, partition: str = "even", kind: str | None = None):
    """The layout ``schedule`` runs ``model`` on: its strategy's kind (:mod:`vpp.schedules.strategies`;
    ``kind="interleaved"`` puts a V strategy on Megatron's interleaved layout instead, stage i on rank
    i mod pp), stages as even as the model's allowed stage starts permit (:meth:`ModelSource.layout`), or
    (``partition="rank"``, given the chunk and prompt sizes) balanced per rank on the cost model and,
    among ties, the fastest for ``schedule`` on the whole prompt (:func:`choose_partition`)."""
    kind = layout_kind(schedule, kind)
    if partition == "even" or chunk is None or seq_len is None:
        return model.layout(kind, pp, folds)
    folds = 1 if kind == "loop" else folds
    sizes = choose_partition(model, kind, pp, folds, chunk=chunk, seq_len=seq_len, how=partition, schedule=schedule)
    return make_layout(kind, model.num_layers, pp, folds=folds, partition=sizes)


def choose_partition(model: ModelSource, kind: str, pp: int, folds: int = 1, *, chunk: int, seq_len: int,
                     how: str = "rank", device: Device | None = None, schedule: str | None = None) -> list[int]:
    """Layers per stage for ``model`` on a ``kind`` layout; with ``schedule`` (a strategy name), the
    fastest on the whole prompt among the rank-balanced ones (see the module docstring)."""
    if how not in PARTITIONS:
        raise ValueError(f"partition={how!r}; expected one of {PARTITIONS}")
    stages = len(stage_ranks_for(kind, pp, folds))
    if how == "even":
        return snap_partition(model.num_layers, stages, model.stage_starts)
    try:
        costs, embed, head = layer_costs(model.config, chunk=chunk, seq_len=seq_len, device=device)
    except (ConfigError, KeyError):
        return snap_partition(model.num_layers, stages, model.stage_starts)
    if schedule is None:
        layout = make_layout(kind, model.num_layers, pp, folds=folds, layer_costs=costs, embed_cost=embed,
                             head_cost=head, per_rank=True, allowed_starts=model.stage_starts)
        return list(layout.partition)
    ranks = stage_ranks_for(kind, pp, folds)
    candidates = balanced_candidates(costs, ranks, embed_cost=embed, head_cost=head, allowed=model.stage_starts)
    if len(candidates) == 1:
        return list(candidates[0])
    time_of = ChunkTime(model.config, device=device)
    chunks = [min(chunk, seq_len - at) for at in range(0, seq_len, chunk)]
    return list(fastest_partition(schedule, kind, pp, candidates, chunks, time_of.layer, folds=folds,
                                  embed_time=time_of.embed, head_time=time_of.head))


def layout_kind(schedule: str, kind: str | None = None) -> str:
    """The layout kind ``schedule`` runs on: its strategy's, or ``kind`` where the strategy's builder
    takes it (a V strategy also runs the interleaved layout: :meth:`vpp.schedules.strategies.Strategy.plan`)."""
    own = strategies.get(schedule).layout
    if kind is None or kind == own:
        return own
    if own == "v" and kind == "interleaved":
        return kind
    raise ValueError(f"{schedule} runs a {own} layout, not {kind!r}" + (
        " (the interleaved layout takes the V schedules: vpp, vpp-async, vpp-packed)" if kind == "interleaved" else ""))


class ChunkTime:
    """The cost model's seconds for one chunk of ``tokens`` tokens after ``prefix`` cached ones: per
    layer, for the embedding and for the final norm and LM head (what :func:`layer_costs` samples at
    the middle of the prompt)."""

    def __init__(self, config: dict, *, device: Device | None = None, par: Parallel | None = None):
        self.arch = Arch.from_config(config)
        self.device = device or get_device("cpu")
        self.par = par or Parallel()
        self.cost = DeploymentCost(self.arch, self.device, make_layout("loop", self.arch.layers, 1), self.par)

    def layer(self, layer: int, tokens: int, prefix: int) -> float:
        return self.cost.layer_time(layer, tokens, prefix)

    def embed(self, tokens: int, prefix: int) -> float:
        return sum(self.device.op_time(op) for op in embed_ops(self.arch, tokens, self.par))

    def head(self, tokens: int, prefix: int) -> float:
        return sum(self.device.op_time(op) for op in head_ops(self.arch, tokens, self.par))


__all__ = ["ChunkTime", "PARTITIONS", "choose_partition", "layer_costs", "layout_for", "layout_kind"]
