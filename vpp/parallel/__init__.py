"""Who talks to whom: device/backend choice, rank grid and process groups, communication verbs,
tensor-parallel layers, TP attention and expert-parallel MoE."""

from vpp.parallel.comm import (
    all_to_all, copy_to_tp, exchange, gather_from_tp, irecv, isend, reduce_from_tp, scatter_to_tp,
)
from vpp.parallel.device import Accelerator, get_accelerator
from vpp.parallel.grid import GridSizes, coordinates, rank_groups
from vpp.parallel.groups import Group, ParallelGroups, build_groups, get_default_groups, initialize_model_parallel
from vpp.parallel.launch import RankFailure, init_distributed, launch, launched_by_torchrun, run_distributed
from vpp.parallel.layers import ColumnParallelLinear, ParallelLMHead, RowParallelLinear, VocabParallelEmbedding
from vpp.parallel.sharding import ReadSlice, Shard, SliceLoader, load_param, load_state, narrowing

__all__ = [name for name in dir() if not name.startswith("_")]
