"""check_same_on_every_rank: what launch(same=...) runs under torchrun before a command's ranks start
(tests/runtime/test_torchrun_nodes.py runs it through two torchrun nodes)."""

from __future__ import annotations

import pytest

from vpp.parallel.spawn import RankFailure, check_same_on_every_rank

pytestmark = pytest.mark.slow  # spawns ranks


def _compare(rank, world, per_rank):
    check_same_on_every_rank(per_rank[rank])
    return "same"


def test_equal_arguments_pass_nan_included(worlds):
    given = {"--seq-len": 64, "--temperature": float("nan"), "--lengths": [1, 2]}
    assert worlds.run(3, _compare, [dict(given) for _ in range(3)], timeout=60) == ["same"] * 3


def test_the_ranks_and_keys_that_differ_are_named(worlds):
    given = [{"--seq-len": 64, "--model": "toy"}, {"--seq-len": 64, "--model": "toy"},
             {"--seq-len": 128, "--model": "toy", "--json": True}]
    with pytest.raises(RankFailure) as err:
        worlds.run(3, _compare, given, timeout=60)
    assert ("global rank(s) [2] of 3 were started with other arguments than global rank 0: global rank 2 has "
            "--json True (global rank 0: None); --seq-len 128 (global rank 0: 64)") in str(err.value)
