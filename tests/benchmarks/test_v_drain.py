"""benchmarks/v_drain.py in its small mode: it runs, its closed forms hold (the script asserts them
against the simulator), and the split it recommends beats the one the per-chunk balancer kept."""

from benchmarks import v_drain


def test_quick_table(capsys):
    assert v_drain.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n| ") == 3                       # header, 4 and 8 chunks
    for n, _cpp, even, v1122, v2121, _best in v_drain.rows(70.0, 48.0, [4, 8]):
        assert float(v2121) < float(even) < float(v1122) < 1.0   # one layer in the drain beats 1.5 and 2


def test_the_even_v_closed_form_needs_growth_below_the_first_chunk():
    """b <= a: S + (tau_0 + tau_{N-1}) / 2 (asserted by rows); b > a: rank 1 also waits for s0/C1, longer."""
    v_drain.rows(48.0, 48.0, [8])                       # the paper's Eq. 2, tau_k = (k + 1) t: the boundary
    a, b, n = 10.0, 48.0, 4
    tau = [3 * (a + b * k) for k in range(n)]
    even = sum(tau) + (tau[0] + tau[-1]) / 2
    assert v_drain.makespan("vpp-async", (1.5,) * 4, n, a, b) > even * (1 + 1e-9)
