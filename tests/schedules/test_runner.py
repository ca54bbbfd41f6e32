"""The one runner, ``vpp.schedules.runner.simulate(strategy, layout, workload, cost)``, and that every
command and benchmark that simulates a strategy goes through it."""

import pytest

from vpp.schedules import LinearCost, make_layout, runner, simulate, simulate_plan, strategies
from vpp.schedules import workloads as W
from vpp.schedules.shared_budget import shared_budget_stream


def unit(**kw) -> LinearCost:
    return LinearCost(per_chunk=1.0, **kw)  # every chunk takes 1 s on every stage, transfers are free


def test_cpp_closed_form():
    """CPP on a loop of P ranks, n equal chunks of one prompt, each 1 s per stage, free transfers:
    the last chunk leaves the last rank at n + P - 1."""
    n, P = 6, 3
    sim = simulate("cpp", make_layout("loop", 3, P), [n * 100], unit(), chunk_size=100, check=True)
    assert sim.trace.makespan == pytest.approx(n + P - 1)
    assert sim.chunks == n and sim.strategy == "cpp" and sim.summary.makespan == pytest.approx(n + P - 1)


@pytest.mark.parametrize("name", strategies.PLANNED + tuple(n for n, s in strategies.STRATEGIES.items() if s.variant))
def test_the_runner_is_the_strategy_table_then_the_simulator(name):
    """For every strategy the runner's plan is the table's builder on the workload's requests (with its
    concurrency and the cost as packing's estimate) and its trace is that plan simulated."""
    wl = W.short(32, n=4, concurrency=2)
    kind = strategies.get(name).layout
    layout = make_layout(kind, 8, 2)
    cost = LinearCost.eq2(1.0, 128, latency=0.01)
    sim = simulate(name, layout, wl, cost, chunk_size=128)
    plan = strategies.get(name).plan(layout, wl.requests(128), concurrency=2, cost=cost)
    assert sim.plan == plan
    assert sim.trace.makespan == simulate_plan(plan, cost).makespan
    assert sim.stats.makespan > 0 and (sum(sim.packed.values()) > 0) == (name == "vpp-packed")


def test_shared_budget_cuts_the_stream_into_shared_steps():
    wl = W.Workload("w", (300, 200, 700), (0.0, 0.0, 0.0), None)
    sim = simulate("cpp", make_layout("loop", 4, 2), wl, unit(), chunk_size=500, shared_budget=True)
    requests, steps = shared_budget_stream(wl.lengths, 500)
    assert sim.plan.requests == tuple(requests)
    assert sim.plan.steps and all(len(g) >= 2 for g in sim.plan.steps)


def test_a_strategy_runs_on_the_layout_it_is_given():
    """The runtime refuses a V strategy on a loop of stage modules; a simulation runs its order there."""
    loop = make_layout("loop", 4, 2)
    with pytest.raises(ValueError, match="needs 2f stages per rank"):
        strategies.get("vpp").plan(loop, W.long(1, lengths=(4096,)).requests(1024))
    assert simulate("vpp-async", loop, [4096], unit(), chunk_size=1024).plan.layout == loop


def test_the_runner_needs_a_budget_or_the_requests():
    with pytest.raises(ValueError, match="give chunk_size"):
        simulate("cpp", make_layout("loop", 2, 2), [100], unit())
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        simulate("nope", make_layout("loop", 2, 2), [100], unit(), chunk_size=10)


@pytest.fixture
def spy(monkeypatch):
    """Counts the plans the runner simulates (every caller below reaches the simulator through it)."""
    seen = []
    real = runner.simulate_plan

    def counting(plan, cost, **kw):
        seen.append(plan.name)
        return real(plan, cost, **kw)
    monkeypatch.setattr(runner, "simulate_plan", counting)
    return seen


def test_every_caller_simulates_through_the_runner(spy, capsys):
    from benchmarks.paper.serving import serve
    from vpp import cli
    from vpp.perf.deployment_search import Candidate, evaluate
    from vpp.perf.hardware import get_device
    from vpp.perf.runs import paper_setup, run
    from vpp.schedules.stream_comparison import StreamSetup, run_strategy

    setup = paper_setup("qwen3-coder-30b-a3b", get_device("910c"))
    run(setup, "vpp-async", [65536], 16384)
    assert spy == ["vpp-async"]
    serve(setup, W.long(16, lengths=(65536,)), "dcpp", 16384)
    assert spy[-1] == "dcpp"
    evaluate(setup, Candidate("v", 1, "even", 16384, "async"), 65536)
    assert spy[-1] == "vpp-async"
    run_strategy(StreamSetup(), W.long(64, lengths=(65536,)), "vpp-packed")
    assert spy[-1] == "vpp-packed"
    assert cli.main(["simulate", "--pp", "2", "--seq-len", "4096", "--chunk-size", "1024", "--json"]) == 0
    capsys.readouterr()
    assert spy[-3:] == ["cpp", "vpp", "vpp-async"]
