"""A healthy stream whose requests arrive further apart than ``timeout_s`` passes on gloo ranks
(issue 33, item 2): a receive of a request that has not arrived is posted once its sender can send, so
neither vpp's deadline nor gloo's own (the process group's timeout, the same ``timeout_s``) runs through
the idle gap. Before, the receive was waited for from the end of the previous request and timed out."""

from __future__ import annotations

import pytest
import torch

from vpp.models.registry import open_model
from vpp.parallel import initialize_model_parallel, run_distributed
from vpp.runtime.pipeline import Pipeline
from vpp.schedules import make_layout

TIMEOUT_S, GAP_S = 1.5, 3.5


def _gap(rank, world, schedule, kind):
    groups = initialize_model_parallel(1, world)
    model = open_model("toy")
    layout = make_layout(kind, model.num_layers, world)
    pipe = Pipeline([model.build(layout.stage_layers[s], groups) for s in layout.stages_of(rank)], groups,
                    timeout_s=TIMEOUT_S)
    prompts = [torch.arange(24) % 50, torch.arange(16) % 50]
    out = pipe.prefill(prompts if 0 in layout.stages_of(rank) else None, 8, schedule=schedule, arrivals=[0.0, GAP_S])
    return sorted(out.all_logits)


@pytest.mark.slow
def test_an_idle_gap_longer_than_the_timeout_passes_on_gloo():
    results = run_distributed(_gap, 2, "vpp-async", "v", timeout=90, pg_timeout_s=TIMEOUT_S)
    assert [0, 1] in results
