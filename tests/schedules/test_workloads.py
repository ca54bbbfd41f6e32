"""The paper's workloads, scaled by one factor; the mixed lengths against the published statistics."""


import pytest

from vpp.schedules import workloads as W
from vpp.schedules.dcpp import DcppPlanner
from vpp.schedules.stream import percentile


def test_mixed_lengths_reproduce_the_published_statistics():
    """A seeded sample of 200,000: median, mean and p90 within 2% of 10K, 22.5K, 64K; min 7, max 122,710."""
    x = W.mixed_lengths(200_000, seed=0)
    assert min(x) == 7 and max(x) == 122_710
    assert percentile(x, 50) == pytest.approx(10_000, rel=0.02)
    assert sum(x) / len(x) == pytest.approx(22_500, rel=0.02)
    assert percentile(x, 90) == pytest.approx(64_000, rel=0.02)


def test_mixed_is_seeded_and_scaled():
    a, b = W.mixed(32, seed=3), W.mixed(32, seed=3)
    assert a == b and a != W.mixed(32, seed=4)
    assert len(a) == 500 and a.concurrency == 16 and a.arrivals == (0.0,) * 500
    assert min(a.lengths) == 1 and max(a.lengths) == round(122_710 / 32)  # 7 tokens / 32 -> at least 1
    assert a.lengths == tuple(max(1, round(n / 32)) for n in W.mixed_lengths(500, seed=3))


def test_one_factor_scales_every_workload():
    assert W.scaled(524_288, 32) == 16_384 and W.scaled(32_768, 32) == 1024 and W.scaled(7, 32) == 1
    long = W.long(32)
    assert long.lengths == (2048, 4096, 8192, 16384, 32768) and long.concurrency == 1
    short = W.short(32, seed=1)
    assert len(short) == 100 and short.concurrency == 100 and set(short.lengths) == {128, 256, 512}
    assert W.short(16, length=8192).lengths == (512,) * 100
    ablation = W.long(32, lengths=(262_144,), repeat=3, concurrency=3)
    assert ablation.lengths == (8192,) * 3 and ablation.concurrency == 3


def test_poisson_arrivals():
    t = W.poisson_arrivals(4000, rate=2.0, seed=5)
    assert t[0] == 0.0 and list(t) == sorted(t) and t == W.poisson_arrivals(4000, rate=2.0, seed=5)
    assert (t[-1] - t[0]) / (len(t) - 1) == pytest.approx(0.5, rel=0.05)
    assert W.mixed(32, n=10, rate=1.0).arrivals[1] > 0


def test_workloads_become_requests():
    wl = W.Workload("w", (2500, 100), (0.0, 1.5), 2, 1)
    reqs = wl.requests(1000)
    assert [q.chunk_sizes for q in reqs] == [(1000, 1000, 500), (100,)] and reqs[1].arrival == 1.5
    planner = DcppPlanner("vllm-ascend", budget=1024)
    planner.fit([256 * i for i in range(1, 10)], [1e-6 * (256 * i) ** 2 + 1e-3 * 256 * i for i in range(1, 10)])
    dc = wl.requests(planner=planner)
    assert [q.length for q in dc] == [2500, 100] and dc[0].num_chunks >= 3 and dc[1].arrival == 1.5
    assert "2 requests" in wl.describe()
    with pytest.raises(ValueError, match="exactly one"):
        wl.requests()
    with pytest.raises(ValueError, match="must not decrease"):
        W.Workload("w", (1, 2), (1.0, 0.0), None)
    with pytest.raises(ValueError, match="concurrency"):
        W.Workload("w", (1,), (0.0,), 0)
