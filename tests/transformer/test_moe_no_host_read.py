"""The "alltoall" MoE dispatch with the grouped expert GEMM (what CUDA and NPU run) reads nothing on the
host (issue 33, item 8): the fixed-capacity exchange computes every place on the device. The rule is
enforced by making every host read of a tensor (``tolist``, ``item``, ``int``, ``bool``) raise during
the forward; the output equals the ragged reference path's (the per-expert loop with host counts)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from vpp.parallel import initialize_model_parallel, run_distributed
from vpp.transformer.moe import MoE, MoEConfig

READS = ("tolist", "item", "__int__", "__bool__", "__index__")


@contextlib.contextmanager
def no_host_reads():
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def refuse(name):
        def read(self, *a, **kw):
            raise AssertionError(f"host read: Tensor.{name} (the host would wait for the device)")
        return read

    for name in READS:
        setattr(torch.Tensor, name, refuse(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


def _block(groups, gemm):
    cfg = MoEConfig(hidden_size=16, moe_intermediate_size=8, num_experts=8, top_k=3, shared_intermediate_size=8)
    torch.manual_seed(0)
    block = MoE(cfg, groups, dispatch="alltoall", gemm=gemm)
    full = {n: torch.randn(p.shape if p.dim() != 3 else (cfg.num_experts, *p.shape[1:])) / 4
            for n, p in block.named_parameters()}
    for n, p in block.named_parameters():
        w = full[n]
        if n.startswith("experts."):
            w = w[block.first_expert:block.first_expert + block.num_local]
        p.data.copy_(w)
    return block


def _rank(rank, world):
    groups = initialize_model_parallel(world, 1, world)
    ref, fixed = _block(groups, "loop"), _block(groups, "grouped_mm")
    out = []
    for t in (1, 5, 13):
        x = torch.randn(t, 16, generator=torch.Generator().manual_seed(t))
        want = ref(x.clone())
        with no_host_reads():
            got = fixed(x.clone())
        out.append(float((got - want).abs().max()))
    return out


def test_the_guard_catches_the_ragged_exchanges_host_read():
    with no_host_reads(), pytest.raises(AssertionError, match="host read: Tensor.tolist"):
        torch.arange(3).tolist()


@pytest.mark.slow
def test_alltoall_dispatch_reads_nothing_on_the_host_and_equals_the_reference():
    for diffs in run_distributed(_rank, 2, timeout=120):
        assert max(diffs) < 1e-5, diffs
