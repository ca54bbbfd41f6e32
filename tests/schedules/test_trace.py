"""Traces: JSON, Chrome export, PNG, and the Table 2 summary with its attribution rule."""

import json

import pytest

from vpp.schedules import (LinearCost, Span, Trace, build_vpp_async, chunk_requests, make_layout, simulate_plan,
                           summarize)
from vpp.schedules.summary import format_summaries


@pytest.fixture(scope="module")
def trace():
    plan = build_vpp_async(make_layout("v", 8, 2), chunk_requests([500, 200], 100))
    return simulate_plan(plan, LinearCost.eq2(1.0, 100, latency=0.2))


def test_json_round_trip(trace, tmp_path):
    trace.save(tmp_path / "t.json")
    back = Trace.load(tmp_path / "t.json")
    assert back == trace and back.meta["plan"] == "vpp-async" and back.meta["source"] == "simulated"


def test_chrome_export(trace, tmp_path):
    out = trace.to_chrome(tmp_path / "t.chrome.json")
    data = json.loads((tmp_path / "t.chrome.json").read_text())
    assert data == json.loads(json.dumps(out))
    boxes = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(boxes) == sum(1 for s in trace.spans if s.duration > 0)
    assert {e["tid"] for e in boxes} == {0, 1} and all(e["dur"] > 0 for e in boxes)
    assert {e["pid"] for e in boxes if e["cat"] == "transfer"} == {1}


def test_png_timeline(trace, tmp_path):
    pytest.importorskip("matplotlib")
    trace.plot(tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_png_titles_say_simulated_or_measured(trace, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes
    titles = []
    monkeypatch.setattr(Axes, "set_title", lambda self, text, **kw: titles.append(text))
    measured = Trace(trace.num_ranks, trace.spans, dict(trace.meta, source="executed"))
    trace.plot(tmp_path / "s.png")
    measured.plot(tmp_path / "m.png")
    assert titles == ["vpp-async (simulated)", "vpp-async (measured)"]


def test_simulated_summary_adds_up(trace):
    s = summarize(trace)
    for r in range(2):
        assert s.compute_per_rank[r] + s.bubble_per_rank[r] + s.exposed_per_rank[r] == pytest.approx(s.makespan)
    assert s.mean("compute") + s.mean("bubble") + s.mean("exposed_comm") == pytest.approx(s.makespan)
    assert s.bubble_ratio == pytest.approx(s.bubble / (2 * s.makespan))
    assert 0 < s.overlap_ratio < 1 and s.comm > s.exposed_comm
    table = format_summaries({"A": s, "B": s})
    for row in ("Computation", "Bubble", "Exposed comm.", "Makespan", "Overlap ratio", "Bubble ratio"):
        assert row in table
    assert set(s.to_dict()) >= {"makespan", "compute", "bubble", "exposed_comm", "overlap_ratio", "bubble_ratio"}


def executed(recv_start=0.0, send_start=4.0, extra=()):
    """What an executor records: rank 1 waited in recv 0..5; rank 0 computed 0..4 and sent 4..5."""
    return Trace(2, (Span(0, "compute", 0, 4, 0, 0, 0), Span(0, "send", send_start, 5, 0, 0, 0, peer=1),
                     Span(0, "compute", 5, 9, 3, 0, 0), Span(1, "recv", recv_start, 5, 0, 0, 0, peer=0),
                     Span(1, "compute", 5, 9, 1, 0, 0)) + tuple(extra))


def test_blocked_receive_splits_into_bubble_and_exposed_comm():
    s = summarize(executed())
    assert s.makespan == 9
    assert s.compute_per_rank == (8, 4)
    assert s.exposed_per_rank == (1, 1)  # both blocked during the 1-unit transfer
    assert s.bubble_per_rank == (0, 4)  # rank 1 waited 4 units for rank 0 to get to its send
    assert s.bubble_ratio == pytest.approx(4 / 18) and s.overlap_ratio == 0


def test_clock_skew_and_missing_partners_are_handled():
    late = summarize(executed(send_start=6.0))  # the peer's send "starts" after the recv ended: skew
    assert late.exposed_per_rank[1] == 0 and late.bubble_per_rank[1] == 5
    early = summarize(executed(recv_start=4.5))  # recv posted after the send: all exposed
    assert early.exposed_per_rank[1] == pytest.approx(0.5) and early.bubble_per_rank[1] == pytest.approx(4.5)
    lone = Trace(2, (Span(0, "compute", 0, 4, 0, 0, 0), Span(1, "recv", 0, 5, 0, 0, 0, peer=0)))
    assert summarize(lone).exposed_per_rank == (0, 5)
    idle = summarize(executed(extra=(Span(1, "idle", 0, 4), Span(0, "idle", 9, 9))))
    assert idle == summarize(executed())
    overlapping = Trace(1, (Span(0, "compute", 0, 4), Span(0, "compute", 3, 5)))  # bad clocks
    assert summarize(overlapping).bubble_per_rank == (0,)


def test_trace_validation():
    with pytest.raises(ValueError, match="span kind 'busy'"):
        Span(0, "busy", 0, 1)
    with pytest.raises(ValueError, match="span on rank 2 in a trace of 2 ranks"):
        Trace(2, (Span(2, "compute", 0, 1),))
