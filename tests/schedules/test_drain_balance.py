"""Partitions chosen on the whole prompt (vpp.schedules.drain_balance): the simulated makespans match the
closed forms of CPP and of the paper's V (its section 5.1, tau_{k-1} + tau_{k+1} = 2 tau_k), and the
fastest partition moves rank 0's work from the drain to the fill."""

import itertools

import pytest

from vpp.schedules import balance_ranks, rank_loads
from vpp.schedules.drain_balance import fastest_partition, simulated_makespans
from vpp.schedules.layout import stage_ranks_for
from vpp.schedules.rank_balance import balanced_candidates

C = 1024
A, B = 0.070, 0.048          # per layer: tau'_k = A + B k seconds for chunk k (a 1K-token chunk after k K)


def layer_time(layer: int, tokens: int, prefix: int) -> float:
    return A * tokens / C + B * tokens * prefix / C ** 2


def tau(k: int, layers: int) -> float:
    return layers * (A + B * k)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_cpp_and_the_even_v_match_their_closed_forms(n):
    """Per rank S = sum_k tau_k. CPP: rank 0 runs every chunk back to back and rank 1 the last one after
    it, S + tau_{N-1}. The V with rank 0's work split evenly between s0 and s3: the steady state has no
    bubble (tau_{k-1} + tau_{k+1} = 2 tau_k), so only the fill (s0/C0, tau_0 / 2) and the drain (s3 of
    the last chunk, tau_{N-1} / 2) are left: S + (tau_0 + tau_{N-1}) / 2. Twelve equal layers, six per rank."""
    chunks = [C] * n
    s = sum(tau(k, 6) for k in range(n))
    [cpp] = simulated_makespans("cpp", "loop", 2, [(6, 6)], chunks, layer_time)
    [v] = simulated_makespans("vpp-async", "v", 2, [(3, 3, 3, 3)], chunks, layer_time)
    assert cpp == pytest.approx(s + tau(n - 1, 6), rel=1e-9)
    assert v == pytest.approx(s + (tau(0, 6) + tau(n - 1, 6)) / 2, rel=1e-9)


def test_a_heavy_last_stage_leaves_it_in_the_drain():
    """Six equal layers, 1/1/2/2: rank 1 (s1 + s2, three layers) is never short of work once s0/C0 is done,
    so it ends at tau'_0 + 3 S'; s3 of the last chunk (two layers) then runs alone: 3 S' + tau'_0 + 2 tau'_{N-1}."""
    n = 8
    s1 = sum(tau(k, 1) for k in range(n))
    [v] = simulated_makespans("vpp-async", "v", 2, [(1, 1, 2, 2)], [C] * n, layer_time)
    assert v == pytest.approx(3 * s1 + tau(0, 1) + tau(n - 1, 2), rel=1e-9)


@pytest.mark.parametrize("n", [4, 8, 16])
def test_fastest_partition_moves_rank0s_work_into_the_fill(n):
    """Among the rank-balanced partitions of six equal layers (rank 0 and 1 three layers each), the
    fastest VPP-Async puts two of rank 0's layers in s0 and one in s3; it beats 1/1/2/2 by at least the
    layer it takes out of the drain less what it adds to the fill, tau'_{N-1} - tau'_0 - tau'_1 >= 0, and
    it is the fastest of every composition of the six layers (brute force)."""
    ranks = stage_ranks_for("v", 2)
    candidates = balanced_candidates([1.0] * 6, ranks)
    assert candidates[0] == balance_ranks([1.0] * 6, ranks)
    assert all(max(rank_loads(p, [1.0] * 6, ranks)) == 3 for p in candidates)
    best = fastest_partition("vpp-async", "v", 2, candidates, [C] * n, layer_time)
    assert best[0] == 2 and best[3] == 1
    every = [p for p in itertools.product(range(1, 4), repeat=4) if sum(p) == 6]
    times = dict(zip(every, simulated_makespans("vpp-async", "v", 2, every, [C] * n, layer_time)))
    assert times[best] == pytest.approx(min(times.values()), rel=1e-12)
    assert times[(1, 1, 2, 2)] - times[best] >= tau(n - 1, 1) - tau(0, 1) - tau(1, 1) - 1e-12


def test_ties_keep_the_candidates_order():
    flat = lambda layer, tokens, prefix: 1.0      # no growth: every balanced split takes as long
    ranks = stage_ranks_for("v", 2)
    candidates = balanced_candidates([1.0] * 6, ranks)
    spans = simulated_makespans("vpp-async", "v", 2, candidates, [C] * 4, flat)
    tied = [p for p, t in zip(candidates, spans) if t == pytest.approx(min(spans))]
    assert fastest_partition("vpp-async", "v", 2, candidates, [C] * 4, flat) == tied[0]
    with pytest.raises(ValueError, match="no candidate partitions"):
        simulated_makespans("cpp", "loop", 2, [], [C], flat)


def test_the_module_docstrings_figures():
    """The figures vpp.schedules.drain_balance quotes: tau'_k = 70 + 48 k ms per layer, 8 chunks, six layers
    (twelve for the even split), VPP-Async over CPP."""
    chunks = [C] * 8
    [cpp] = simulated_makespans("cpp", "loop", 2, [(3, 3)], chunks, layer_time)
    heavy_last, heavy_first = simulated_makespans("vpp-async", "v", 2, [(1, 1, 2, 2), (2, 1, 2, 1)], chunks, layer_time)
    [cpp12] = simulated_makespans("cpp", "loop", 2, [(6, 6)], chunks, layer_time)
    [even] = simulated_makespans("vpp-async", "v", 2, [(3, 3, 3, 3)], chunks, layer_time)
    assert [round(heavy_last / cpp, 3), round(heavy_first / cpp, 3), round(even / cpp12, 3)] == [0.952, 0.907, 0.927]
