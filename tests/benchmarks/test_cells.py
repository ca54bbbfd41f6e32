"""The cell-by-cell comparison: errors, points for gains, statuses from what the fit touches, duplicates."""

import pytest

from benchmarks.paper import published as paper
from benchmarks.paper.cells import Cell, assign, dedupe, markdown, required_step_cost, summary
from benchmarks.paper.claims import receives_per_chunk, table_cells
from vpp.perf.decompose import Row

FIT = ("Table 1", "CPP computation")


def test_errors_of_points_and_ranges():
    assert Cell("Sweep", "x", 10.0, 11.0, "%").error == pytest.approx(0.1)
    assert Cell("Sweep", "x", (1.6, 3.6), 2.0, "%").error == 0.0
    assert Cell("Sweep", "x", (1.6, 3.6), 4.0, "%").error == pytest.approx(0.4 / 3.6)
    assert Cell("Sweep", "x", (1.6, 3.6), -1.6, "%").error == pytest.approx(-2.0)
    assert Cell("Sweep", "x", "words only", 1.0).error is None and Cell("Sweep", "x", 1.0, None).error is None


def test_gains_are_scored_in_points_beside_the_relative_error():
    g = Cell("Sweep", "g", 3.7, 5.6, "%", gain=True)            # +51% relative, 1.9 points
    assert g.points == pytest.approx(1.9) and g.error == pytest.approx(1.9 / 3.7) and g.within
    assert not Cell("Sweep", "g", 3.7, 5.8, "%", gain=True).within
    assert Cell("Sweep", "g", (1.6, 3.6), -0.3, "%", gain=True).points == pytest.approx(-1.9)
    assert not Cell("Sweep", "r", 3.7, 5.6, "%").within             # not a gain: relative 10%
    c = Cell("T", "contradiction", 13.1, 14.0, "%", gain=True, alt=("table", 14.3))
    assert c.within and c.within_alt and "other reading (table)" in markdown([c])


def _moved(base, **shift):
    return [Cell(c.section, c.row, c.paper, c.model + shift.get(c.row, 0.0), c.unit, parts=c.parts) for c in base]


def test_status_follows_what_the_fit_touches():
    base = [Cell(*FIT, 250.0, 250.0), Cell("Table 2(a)", "VPP computation", 250.0, 251.0),
            Cell("Table 1", "CPP bubble", 38.0, 27.0), Cell("Sweep", "gain", 3.0, 3.5, "%", gain=True),
            Cell("Table 2(c)", "VPP Launch stall", 0.0004, 0.0), Cell("Fig", "steps", 8, 8, "steps", structural="128K/16K"),
            Cell("Table 1", "delta computation", 26.0, 30.0, parts=(FIT, ("Table 2(a)", "VPP computation")))]
    moved = {"eff_attn": (FIT, _moved(base, **{"CPP computation": 25.0, "VPP computation": 24.0, "CPP bubble": 2.5}))}
    st = {c.row: c.status for c in assign(base, moved)}
    assert st == {"CPP computation": "fitted", "VPP computation": "derived", "CPP bubble": "predicted",
                  "gain": "predicted", "VPP Launch stall": "structural", "steps": "structural",
                  "delta computation": "predicted"}
    # a cell that is the fitted one, if it were not recognised as such, would come out derived, never predicted
    relabelled = assign(base, {"eff_attn": (("Table 2(a)", "VPP computation"), moved["eff_attn"][1])})
    assert {c.row: c.status for c in relabelled}["CPP computation"] == "derived"
    with pytest.raises(ValueError, match="not a cell"):
        assign(base, {"x": (("Nope", "nothing"), base)})


def test_a_delta_between_two_predicted_cells_is_a_duplicate():
    a, b = ("T", "DCPP Slice"), ("T", "VPP Slice")
    cells = [Cell(*a, 22.9, 23.0), Cell(*b, 5.2, 4.0), Cell("T", "delta Slice", -17.7, -19.0, parts=(a, b)),
             Cell(*FIT, 1.0, 1.0).with_status("fitted"), Cell("T", "delta f", 1.0, 1.0, parts=(FIT, a))]
    kept, dropped = dedupe(cells)
    assert [c.row for c in kept] == ["DCPP Slice", "VPP Slice", "CPP computation", "delta f"]
    assert dropped == ["T: delta Slice (= VPP Slice - DCPP Slice, both scored)"]


def test_summary_counts_per_status():
    cells = [Cell(*FIT, 1.0, 1.0).with_status("fitted"), Cell("T", "a", 100.0, 109.0), Cell("T", "b", 100.0, 111.0),
             Cell("T", "z", 0.0004, 0.0).with_status("structural")]
    s = summary(cells)
    assert s["counts"] == {"fitted": 1, "derived": 0, "structural": 1, "predicted": 2}
    assert (s["predicted_scored"], s["predicted_within"], s["missed"]) == (2, 1, ["T: b"])
    assert "| T | b | 100.00 | 111.00 | +11.0% | - | predicted | **no** |" in markdown(cells)
    with pytest.raises(ValueError, match="status"):
        Cell("T", "x", 1.0, 1.0).with_status("guessed")


def test_table_cells_cover_every_published_number_once():
    P = paper.TABLE_512K
    rows = {s: Row(s, P[p]["total"], P[p]["compute"], P[p]["bubble"], P[p]["exposed_comm"], 10,
                   {"attention": 1.0, "prefix_mem": 1.0, "prefix_gemm": 1.0, "launch_stall": 0.5})
            for s, p in (("cpp", "cpp"), ("dcpp", "dcpp"), ("vpp-async", "vpp"))}
    cells = table_cells(rows)
    keys = [c.key for c in cells]
    assert len(keys) == len(set(keys)) and FIT in keys and ("Table 2(c)", "DCPP Launch stall") in keys
    assert not any("delta/" in r or "Free" in r or r.startswith("DCPP") for s, r in keys if s == "Table 2(a)")
    t1 = {c.row: c for c in cells if c.section == "Table 1"}
    assert all(c.error == pytest.approx(0.0, abs=1e-12) for c in t1.values())   # the paper's own numbers in
    assert t1["DCPP over CPP throughput (delta total)"].paper == pytest.approx(-4.44, abs=0.01)
    net = {c.row: c for c in cells}["VPP over DCPP throughput, 512K"]
    assert net.paper == pytest.approx(13.1) and net.alt[1] == pytest.approx(14.32, abs=0.01)   # -12.53% TTFT


def test_required_step_cost():
    # DCPP 110 s in 20 steps, VPP 100 s: a 10% gain needs no extra cost, 21% needs (121 - 110) / 20 = 0.55 s a step
    assert required_step_cost(110.0, 100.0, 20, 0.10) == pytest.approx(0.0)
    assert required_step_cost(110.0, 100.0, 20, 0.21) == pytest.approx(0.55)


def test_a_cell_holding_a_small_fitted_term_stays_predicted():
    stall, bubble = ("Table 2(c)", "DCPP Launch stall"), ("Table 1", "DCPP bubble")
    base = [Cell(*stall, 1.85, 1.85), Cell(*bubble, 20.47, 11.5)]       # bubble = 9.65 s Free + the stall
    moved = {"host_step": (stall, _moved(base, **{"DCPP Launch stall": -0.185, "DCPP bubble": -0.185}))}
    assert [c.status for c in assign(base, moved)] == ["fitted", "predicted"]


def test_hand_overs_received_per_rank():
    from vpp.schedules import make_layout
    assert receives_per_chunk(make_layout("loop", 61, 2)) == [0, 1]          # rank 1 receives from rank 0
    assert receives_per_chunk(make_layout("v", 61, 2)) == [1, 1]        # 0 -> 1, 1 -> 1 local, 1 -> 0
