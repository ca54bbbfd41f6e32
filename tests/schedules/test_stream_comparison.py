"""The simulated stream comparison and ``vpp serve-sim``."""

import json

import pytest

from vpp import cli
from vpp.schedules import make_layout, strategies
from vpp.schedules import workloads as W
from vpp.schedules.stream_comparison import (EXTRA, StreamSetup, compare, format_table, machine_cost,
                                             packing_effect)

STRATEGIES = strategies.PLANNED


def test_machine_cost_reproduces_the_law_it_is_given():
    """Any (first, growth): the k-th full chunk of one layer takes first + growth k, by construction of
    the per-token, per-prefix-pair and in-chunk terms (derived in machine_cost's docstring); half a
    chunk at prefix 0 costs less than half a full one (in-chunk attention is quadratic), and the
    transfer is latency + bytes / bandwidth."""
    first, growth, chunk = 0.2, 0.05, 256
    cost = machine_cost(make_layout("loop", 2, 2), chunk=chunk, first=first, growth=growth, overhead=0.004,
                        hidden=64, bytes_per_value=2, bandwidth=1e9, latency=1e-4)  # one layer per stage
    tau = [cost.compute(0, chunk, chunk * k) for k in range(5)]
    assert tau == pytest.approx([first + growth * k for k in range(5)])
    assert cost.compute(0, chunk // 2, 0) - 0.004 < (first - 0.004) / 2
    assert cost.transfer(chunk) == pytest.approx(1e-4 + chunk * 64 * 2 / 1e9)


def test_five_strategies_on_the_ablation_stream():
    wl = W.long(32, lengths=(262144,), repeat=3, concurrency=3)
    # a 1024-token budget: a floor of 256 leaves DCPP room to shrink (the engine's 4096 clamps to the budget)
    rows = compare(StreamSetup(dcpp_min_chunk=256), wl, STRATEGIES + EXTRA)
    assert set(rows) == set(STRATEGIES + EXTRA)
    assert rows["dcpp"].chunks > rows["cpp"].chunks == rows["vpp"].chunks == 24
    e = packing_effect(rows)
    assert e["packed_chunks"] > 0 and e["drain_idle_removed"] > 0.7 and e["makespan_saved"] > 0.03
    assert rows["vpp-packed"].stats.throughput > rows["vpp-async"].stats.throughput
    assert rows["vpp-packed"].summary.bubble_ratio < rows["vpp"].summary.bubble_ratio
    table = format_table({k: rows[k] for k in STRATEGIES})
    body = [line for line in table.splitlines()[2:]]
    assert [line.split("|")[1].strip() for line in body] == [strategies.get(k).label for k in STRATEGIES]
    assert "TTFT p90" in table.splitlines()[0]


def test_serve_sim_is_registered_and_prints_json(capsys):
    assert cli.main(["serve-sim", "--workload", "short", "--n", "6", "--length", "16384",
                     "--strategies", "cpp", "vpp-async", "vpp-packed", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["rows"]) == {"cpp", "vpp-async", "vpp-packed"}
    assert out["packing"]["packed_chunks"] > 0
    assert out["rows"]["vpp-packed"]["makespan"] < out["rows"]["vpp-async"]["makespan"]


def test_serve_sim_table(capsys):
    assert cli.main(["serve-sim", "--workload", "mixed", "--n", "12", "--concurrency", "4"]) == 0
    text = capsys.readouterr().out
    assert "mixed: 12 requests" in text and "concurrency 4" in text and "Packing vs VPP-Async" in text
