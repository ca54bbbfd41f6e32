"""A rank's stage modules listed out of stage order are refused in one line (the pipeline pairs modules
with the layout's stages by position: [s2, s1] once ran each chunk through the wrong layers). Every rank
holds every rank's descriptor, so every rank raises the same line; in-process, one rank holding a V."""

from __future__ import annotations

import re

import pytest
import torch

from vpp.models.registry import open_model
from vpp.parallel.groups import ParallelGroups
from vpp.runtime import forward_prefill
from vpp.runtime.pipeline import Pipeline


@pytest.fixture(scope="module")
def stages():
    model, groups = open_model("tiny-qwen"), ParallelGroups.single()
    return [model.build((0, 3), groups), model.build((3, 6), groups)], groups


def test_out_of_order_stages_are_refused(stages):
    (s1, s2), groups = stages
    message = ("pipeline rank(s) [0] list their stage modules out of stage order: pipeline rank 0 gives layer "
               "ranges [[3, 6], [0, 3]], the layout's stages on it are [[0, 3], [3, 6]]")
    with pytest.raises(ValueError, match=re.escape(message)):
        Pipeline([s2, s1], groups)
    with pytest.raises(ValueError, match="out of stage order"):
        forward_prefill([s2, s1], torch.arange(8), 4, groups, schedule="vpp")


def test_in_order_stages_run(stages):
    (s1, s2), groups = stages
    out = forward_prefill([s1, s2], torch.arange(8), 4, groups, schedule="vpp")
    assert out.logits is not None
