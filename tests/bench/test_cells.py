"""The cell-by-cell comparison: errors, fitted / predicted marks, the required-cost algebra."""

import pytest

from vpp.bench import paper
from benchmarks.cells import FITTED, Cell, markdown, required_step_cost, summary, table_cells
from vpp.perf.decompose import Row


def test_errors_of_points_and_ranges():
    assert Cell("Sweep", "x", 10.0, 11.0, "%").error == pytest.approx(0.1)
    assert Cell("Sweep", "x", (1.6, 3.6), 2.0, "%").error == 0.0
    assert Cell("Sweep", "x", (1.6, 3.6), 4.0, "%").error == pytest.approx(0.4 / 3.6)
    assert Cell("Sweep", "x", (1.6, 3.6), -1.6, "%").error == pytest.approx(-2.0)
    assert Cell("Sweep", "x", "words only", 1.0).error is None and Cell("Sweep", "x", 1.0, None).error is None


def test_fitted_cells_are_never_counted_as_reproduced():
    fitted = Cell("Table 1", "CPP computation", 252.59, 252.59)
    assert fitted.status == "fitted" and not fitted.reproduced()
    close, far = Cell("Table 1", "DCPP computation", 100.0, 109.0), Cell("Table 1", "DCPP bubble", 100.0, 111.0)
    assert close.status == "predicted" and close.reproduced() and not far.reproduced()
    s = summary([fitted, close, far])
    assert (s["fitted"], s["scored"], s["reproduced"]) == (1, 2, 1) and s["missed"] == ["Table 1: DCPP bubble"]
    assert "| Table 1 | DCPP bubble | 100.00 | 111.00 | +11.0% | predicted | **no** |" in markdown([far])


def test_table_cells_cover_every_published_number_once():
    P = paper.TABLE_512K
    rows = {s: Row(s, P[p]["total"], P[p]["compute"], P[p]["bubble"], P[p]["exposed_comm"], 10,
                   {"attention": 1.0, "prefix_mem": 1.0, "prefix_gemm": 1.0, "launch_stall": 0.5})
            for s, p in (("cpp", "cpp"), ("dcpp", "dcpp"), ("vpp-async", "vpp"))}
    cells = table_cells(rows)
    t1 = {c.row: c for c in cells if c.section == "Table 1"}
    assert len(t1) == 16 and t1["delta/CPP total"].paper == pytest.approx(4.65, abs=0.01)
    assert all(c.error == pytest.approx(0.0, abs=1e-12) for c in t1.values())   # the paper's own numbers in
    assert {(c.section, c.row) for c in cells} >= FITTED
    net = {c.row: c for c in cells if c.section == "Table 2(a)"}["delta/DCPP total"]
    assert net.paper == pytest.approx(-12.53, abs=0.01)


def test_numbers_near_zero_compare_absolutely():
    assert Cell("Table 2(c)", "VPP Launch stall", 0.00036, 0.0).reproduced()          # -100%, but 0.4 ms apart
    assert Cell("Table 2 text", "DCPP overlap ratio", 0.05, 0.0, "%").reproduced()
    assert not Cell("Table 2(a)", "VPP bubble", 0.39, 2.06).reproduced()


def test_required_step_cost():
    # DCPP 110 s in 20 steps, VPP 100 s: a 10% gain needs no extra cost, 21% needs (121 - 110) / 20 = 0.55 s a step
    assert required_step_cost(110.0, 100.0, 20, 0.10) == pytest.approx(0.0)
    assert required_step_cost(110.0, 100.0, 20, 0.21) == pytest.approx(0.55)
