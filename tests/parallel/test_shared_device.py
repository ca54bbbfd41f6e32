"""Two CUDA ranks on one GPU are accepted only when each has its own ``NCCL_HOSTID`` (NCCL then runs
them as hosts apart over sockets); nothing else lifts the one-device-per-rank check (issue 33)."""

from __future__ import annotations

import pytest
import torch

from vpp.parallel.device import Accelerator
from vpp.parallel.spawn import check_device_count


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    return Accelerator("cuda", "nccl")


def test_distinct_host_ids_let_two_ranks_share_one_gpu(one_gpu):
    check_device_count(one_gpu, 2, host_ids=["vpp-pair-0", "vpp-pair-1"])


@pytest.mark.parametrize("host_ids", [None, ["a", "a"], ["a", ""], ["a"], ["a", "b", "c"]])
def test_anything_else_is_still_refused(one_gpu, host_ids):
    with pytest.raises(RuntimeError, match="2 ranks need one cuda device each, but 1 is visible"):
        check_device_count(one_gpu, 2, host_ids=host_ids)
