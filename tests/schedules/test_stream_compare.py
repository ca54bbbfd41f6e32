"""The simulated stream comparison and ``vpp serve-sim``."""

import json

import pytest

from vpp import cli
from vpp.schedules import make_layout
from vpp.schedules import workloads as W
from vpp.schedules.stream_compare import (EXTRA, STRATEGIES, StreamSetup, compare, format_table, machine_cost,
                                          packing_effect)


def test_machine_cost_is_the_measured_law():
    """BENCH.md: one layer, 1K-token chunks, tau_k ~ 89 + 34 k ms."""
    cost = machine_cost(make_layout("loop", 2, 2))  # one layer per stage
    assert [cost.compute(0, 1024, 1024 * k) for k in range(4)] == pytest.approx([0.089, 0.123, 0.157, 0.191])
    assert cost.compute(0, 512, 0) < cost.compute(0, 1024, 0) / 2 + 0.002  # in-chunk attention is quadratic
    assert 0 < cost.transfer(1024) < 0.002


def test_five_strategies_on_the_ablation_stream():
    wl = W.long(32, lengths=(262144,), repeat=3, concurrency=3)
    rows = compare(StreamSetup(), wl, STRATEGIES + EXTRA)
    assert set(rows) == set(STRATEGIES + EXTRA)
    assert rows["dcpp"].chunks > rows["cpp"].chunks == rows["vpp"].chunks == 24
    e = packing_effect(rows)
    assert e["packed_chunks"] > 0 and e["drain_idle_removed"] > 0.7 and e["makespan_saved"] > 0.03
    assert rows["vpp-async-packed"].stats.throughput > rows["vpp-async"].stats.throughput
    assert rows["vpp-async-packed"].summary.bubble_ratio < rows["vpp"].summary.bubble_ratio
    table = format_table({k: rows[k] for k in STRATEGIES})
    assert table.count("\n") == 6 and "VPP-Async + packing" in table and "TTFT p90" in table


def test_serve_sim_is_registered_and_prints_json(capsys):
    assert cli.COMMANDS["serve-sim"][0] == "vpp.schedules.cli_serve_sim"
    assert cli.main(["serve-sim", "--workload", "short", "--n", "6", "--length", "16384",
                     "--strategies", "cpp", "vpp-async", "vpp-async-packed", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["rows"]) == {"cpp", "vpp-async", "vpp-async-packed"}
    assert out["packing"]["packed_chunks"] > 0
    assert out["rows"]["vpp-async-packed"]["makespan"] < out["rows"]["vpp-async"]["makespan"]


def test_serve_sim_table(capsys):
    assert cli.main(["serve-sim", "--workload", "mixed", "--n", "12", "--concurrency", "4"]) == 0
    text = capsys.readouterr().out
    assert "mixed: 12 requests" in text and "concurrency 4" in text and "Packing vs VPP-Async" in text
