"""Every chunk-sized buffer a run allocates is sized as the memory plan sized it: a chunk larger than the
prompt is the prompt (``--chunk-size 10**12`` on a 64-token prompt probes and profiles 64 tokens, not
10**12; the ranks once tried to allocate 256 TB for the transfer probe). In-process, one rank."""

from __future__ import annotations

import pytest

from vpp.cli import prefill_rounds
from vpp.parallel.groups import ParallelGroups
from vpp.perf.memory_plan import plan_memory, planned_chunk
from vpp.perf.arch import Arch
from vpp.models.tiny import TINY_CONFIGS
from vpp.config import model_config


def test_the_run_sizes_chunk_buffers_as_the_plan(monkeypatch):
    asked = []
    real_probe, real_profile = prefill_rounds.measure_transfer, prefill_rounds.profile_planner

    def probe(groups, tokens, hidden, dtype, *a, **k):
        asked.append(("probe", tokens))
        return real_probe(groups, tokens, hidden, dtype, *a, **k)

    def profile(stages, groups, budget, **k):
        asked.append(("dcpp budget", budget))
        return real_profile(stages, groups, budget, **k)

    monkeypatch.setattr(prefill_rounds, "measure_transfer", probe)
    monkeypatch.setattr(prefill_rounds, "profile_planner", profile)
    cfg = prefill_rounds.BenchConfig(model="tiny-qwen", pp=1, seq_len=64, chunk_size=10**12, schedules=("cpp",),
                                     repeat=1, warmup=False, pin=False, partition="even")
    rows, _ = prefill_rounds.run_bench(ParallelGroups.single(), cfg)
    assert [r.schedule for r in rows] == ["cpp"]
    plan = plan_memory(Arch.from_config(model_config(TINY_CONFIGS["tiny-qwen"])), [[0, 1, 2, 3, 4, 5]], tp=1,
                       dtype_bytes=4, tokens=64, chunk=10**12)
    assert planned_chunk(10**12, 64) == 64
    assert asked == [("probe", 64)]
    assert plan[0].activations < 2**30  # the plan saw 64 tokens per chunk, as the run allocated


@pytest.mark.parametrize("chunk, tokens, expect", [(10**12, 64, 64), (16, 64, 16), (64, 64, 64)])
def test_planned_chunk(chunk, tokens, expect):
    assert planned_chunk(chunk, tokens) == expect
