"""A Pipeline's plan cache is bounded: a server that sees a new chunking per request keeps flat memory
(benchmarks/soak.py found the resident set growing with an unbounded cache)."""

import torch

from vpp.models import build_stage, model_config, random_checkpoint
from vpp.models.tiny import TINY_CONFIGS
from vpp.parallel.device import get_accelerator
from vpp.parallel.groups import ParallelGroups
from vpp.schedules.ir import chunk_requests
from vpp.runtime.pipeline import PLAN_CACHE, Pipeline


def test_plan_cache_keeps_the_most_recent():
    config = model_config(dict(TINY_CONFIGS["tiny-deepseek"], num_hidden_layers=2))
    groups = ParallelGroups.single(get_accelerator("cpu"), torch.device("cpu"))
    pipe = Pipeline([build_stage(config, (0, 2), groups, weights=random_checkpoint(config, seed=0))], groups)
    plans = [pipe.plan("cpp", chunk_requests([n], 4)) for n in range(1, PLAN_CACHE + 11)]
    assert len(pipe._plans) == PLAN_CACHE
    assert pipe.plan("cpp", chunk_requests([PLAN_CACHE + 10], 4)) is plans[-1]  # still cached: the same object
    assert pipe.plan("cpp", chunk_requests([1], 4)) is not plans[0]  # evicted, built again
