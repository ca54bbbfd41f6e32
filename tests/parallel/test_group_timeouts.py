"""Every subgroup gets the run's timeout (issue 33, item 1): torch gives a ``new_group`` without one its
backend's default (10 minutes on NCCL), so a quiet gap longer than that tore the process down."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from vpp.parallel.device import get_accelerator
from vpp.parallel.grid import GridSizes
from vpp.parallel.groups import build_groups, group_timeout


def test_every_subgroup_is_created_with_the_runs_timeout(monkeypatch):
    seen = []
    monkeypatch.setattr(dist, "new_group", lambda ranks, **kw: seen.append((tuple(ranks), kw.get("timeout"))) or object())
    groups = build_groups(GridSizes(8, tp=2, pp=2, dp=2, ep=1), 0, get_accelerator("cpu"), torch.device("cpu"),
                          instance=True, timeout_s=42)
    assert groups is not None and len(seen) >= 5
    assert {t for _, t in seen} == {datetime.timedelta(seconds=42)}, seen


def test_the_default_timeout_is_the_default_groups(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=37))
    try:
        assert group_timeout() == datetime.timedelta(seconds=37)
        assert group_timeout(5) == datetime.timedelta(seconds=5)
    finally:
        dist.destroy_process_group()
