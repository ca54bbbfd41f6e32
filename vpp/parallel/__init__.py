"""Who talks to whom: device/backend choice, rank grid and process groups, communication verbs,
tensor-parallel linear layers and the per-parameter shard specs that load them. The model math built
from these pieces (attention, MoE, router, MLP) lives in :mod:`vpp.transformer`."""

from vpp.parallel.comm import (
    all_to_all, copy_to_tp, exchange, gather_from_tp, irecv, isend, reduce_from_tp, scatter_to_tp,
)
from vpp.parallel.device import Accelerator, get_accelerator
from vpp.parallel.grid import GridSizes, coordinates, rank_groups
from vpp.parallel.groups import Group, ParallelGroups, build_groups, initialize_model_parallel
from vpp.parallel.layers import ColumnParallelLinear, ParallelLMHead, RowParallelLinear, VocabParallelEmbedding
from vpp.parallel.sharding import ReadSlice, Shard, SliceLoader, load_param, load_state, narrowing
from vpp.parallel.spawn import RankFailure, init_distributed, launch, launched_by_torchrun, run_distributed

__all__ = [
    "Accelerator", "ColumnParallelLinear", "GridSizes", "Group", "ParallelGroups", "ParallelLMHead", "RankFailure",
    "ReadSlice", "RowParallelLinear", "Shard", "SliceLoader", "VocabParallelEmbedding", "all_to_all",
    "build_groups", "coordinates", "copy_to_tp", "exchange", "gather_from_tp", "get_accelerator",
    "init_distributed", "initialize_model_parallel", "irecv", "isend", "launch", "launched_by_torchrun",
    "load_param", "load_state", "narrowing", "rank_groups", "reduce_from_tp", "run_distributed", "scatter_to_tp",
]
