"""``vpp serve-bench`` end to end on spawned CPU ranks with the toy model (in this process, through
``vpp.cli.main``: the command's parsing, checks and spawned ranks): every contender runs the stream and
reports makespan, throughput and (for vpp's own schedules) TTFT and bubble ratio."""

import json

import pytest

from vpp import cli

pytestmark = pytest.mark.slow  # every test here starts processes


def _serve_bench(capsys, *argv) -> dict:
    assert cli.main(["serve-bench", "--model", "toy", "--workload", "short", "--n", "4", "--scale", "512", *argv,
                     "--json"]) == 0, capsys.readouterr().err[-3000:]
    return json.loads(capsys.readouterr().out)


def test_serve_bench_runs_every_contender(capsys):
    out = _serve_bench(capsys, "--chunk-size", "8", "--repeat", "2")
    names = [r["name"] for r in out["rows"]]
    assert names == ["cpp", "dcpp", "vpp", "vpp-async", "vpp-packed", "gpipe"]
    assert out["facts"]["lengths"] and out["facts"]["concurrency"] == 4
    for row in out["rows"]:
        assert len(row["makespan"]) == 2 and min(row["makespan"]) > 0
        tokens = sum(out["facts"]["lengths"])
        assert abs(row["throughput"][0] - tokens / row["makespan"][0]) < 1e-6 * row["throughput"][0]
        if row["name"] != "gpipe":
            assert len(row["ttft_median"]) == 2 and 0 < row["ttft_median"][0] <= row["ttft_p90"][0]
            assert 0 <= row["bubble_ratio"][0] < 1
    assert out["rows"][0]["speedup"] == [1.0, 1.0]


def test_serve_bench_with_a_shared_budget_replays_in_the_simulator(capsys):
    """Requests share one token budget per step (their chunk lists from plan/shared_budget.py); every
    row carries the executed trace's makespan and the simulator's replay of the same plan."""
    out = _serve_bench(capsys, "--chunk-size", "12", "--repeat", "1", "--contenders", "cpp,dcpp,vpp-async",
                       "--shared-budget", "--dcpp-min-chunk", "4")
    assert out["config"]["shared_budget"] is True
    assert [r["name"] for r in out["rows"]] == ["cpp", "dcpp", "vpp-async"]
    for row in out["rows"]:
        assert len(row["sim_makespan"]) == 1 and row["sim_makespan"][0] > 0 and row["trace_makespan"][0] > 0
