"""The simulator against closed forms derived here by hand, beyond P = 2 and tau_k = (k + 1) t.

Costs: a stage of chunk k takes tau_k = a + b k (``LinearCost`` with per_token = a / C and
per_token_prefix = b / C^2 on chunks of C tokens); b >= 0.

CPP, P ranks, no transfer time. F(p, k), the end of chunk k on rank p, obeys
F(p, k) = max(F(p-1, k), F(p, k-1)) + tau_k. Claim: F(p, k) = F(0, k) + p tau_k. Induction:
F(p-1, k) = F(0, k) + (p-1) tau_k and F(p, k-1) = F(0, k-1) + p tau_{k-1}, so
F(p-1, k) - F(p, k-1) = p (tau_k - tau_{k-1}) = p b >= 0 and the max is F(p-1, k). Makespan = sum_k tau_k + (P-1) tau_{N-1}; every rank computes sum_k tau_k, so each idles
(P-1) tau_{N-1}. Blocking sends do not change it: rank p reaches SEND k at F(p, k), rank p+1 reaches
RECV k at F(p+1, k-1) <= F(p, k) (same difference), so no send waits.

CPP, non-blocking, latency d. A transfer starts once both ends are posted (:mod:`vpp.schedules.engine`);
rank p posts RECV k right after computing chunk k-1, so
F(p, k) = max(F(p-1, k), F(p, k-1)) + d + tau_k for p >= 1. If d <= b: F(p, k) = F(0, k) + p (d + tau_k)
(the same induction: F(p-1, k) - F(p, k-1) = p b - d >= 0 for every p >= 1), so the latency adds
exactly the P-1 hand-overs of the last chunk. If b = 0 (constant tau) this is a flow shop
with stage times tau (rank 0) and tau + d (the others): makespan = tau + (P-1)(tau + d) + (N-1)(tau + d).

VPP on a V, P = 2, blocking, no transfer time (Algorithm 1). Let W_k be when rank 1 starts s1/C_k.
Rank 0 runs s0/C0, s0/C1 back to back (ends 2a + b); rank 1 ends window 0 at 3a, so
W_1 = max(3a, 2a + b): rank 1 idles max(0, b - a) before C1, rank 0 idles max(0, a - b) before s3/C0
(blocked in its send to rank 1 when a > b). For k >= 1 rank 0 runs s3/C_{k-1} and s0/C_{k+1} inside
window k: tau_{k-1} + tau_{k+1} = 2 tau_k (Eq. 3b for any linear tau), so nobody idles and
W_{k+1} = W_k + 2 tau_k. In the last window rank 0 idles 2 tau_{N-1} - tau_{N-2} = a + b N (the drain),
then runs s3/C_{N-1} while rank 1 idles tau_{N-1}. Makespan = W_{N-1} + 3 tau_{N-1}, with
W_{N-1} = max(3a, 2a + b) + sum_{j=1}^{N-2} 2 tau_j. Idle: rank 0 max(0, a - b) + a + b N, rank 1
a + max(0, b - a) + tau_{N-1} (equal, as they must be: both compute 2 sum tau). With a = b = t this is
the (N+1)^2 t of ``test_simulator.py``.
"""

import pytest

from vpp.schedules import LinearCost, build_cpp, build_vpp, chunk_requests, make_layout, simulate_plan, summarize

C = 10


def cost(a, b, **kw):
    return LinearCost(per_token=a / C, per_token_prefix=b / C ** 2, **kw)


def cpp(pp, n, a, b, comm="blocking", **kw):
    plan = build_cpp(make_layout("loop", pp, pp), chunk_requests([n * C], C), comm=comm)
    return simulate_plan(plan, cost(a, b, **kw))


@pytest.mark.parametrize("pp", [1, 3, 4, 6])
@pytest.mark.parametrize("a, b", [(1.0, 0.0), (2.0, 0.5), (0.5, 2.0)])
@pytest.mark.parametrize("comm", ["blocking", "async"])
def test_cpp_makespan_and_idle_per_rank(pp, a, b, comm):
    n = 5
    tau = [a + b * k for k in range(n)]
    trace = cpp(pp, n, a, b, comm)
    assert trace.makespan == pytest.approx(sum(tau) + (pp - 1) * tau[-1])
    assert summarize(trace).bubble_per_rank == pytest.approx([(pp - 1) * tau[-1]] * pp)


@pytest.mark.parametrize("pp", [2, 3, 5])
def test_cpp_async_latency_adds_the_last_chunks_hand_overs(pp):
    n, a, b, d = 6, 1.0, 0.5, 0.3           # d <= b: every other transfer hides
    tau = [a + b * k for k in range(n)]
    assert cpp(pp, n, a, b, "async", latency=d).makespan == pytest.approx(sum(tau) + (pp - 1) * (tau[-1] + d))


@pytest.mark.parametrize("pp", [2, 4])
def test_cpp_async_constant_cost_is_a_flow_shop(pp):
    n, tau, d = 5, 1.0, 0.7                 # the receive is posted after the previous compute: every hop shows
    expected = tau + (pp - 1) * (tau + d) + (n - 1) * (tau + d)
    assert cpp(pp, n, tau, 0.0, "async", latency=d).makespan == pytest.approx(expected)


@pytest.mark.parametrize("n", [2, 3, 6])
@pytest.mark.parametrize("a, b", [(2.0, 0.5), (0.5, 2.0), (1.0, 0.0)])
def test_vpp_two_ranks_with_any_linear_cost(n, a, b):
    tau = [a + b * k for k in range(n)]
    trace = simulate_plan(build_vpp(make_layout("v", 4, 2), chunk_requests([n * C], C)), cost(a, b))
    w_last = max(3 * a, 2 * a + b) + sum(2 * tau[j] for j in range(1, n - 1))
    assert trace.makespan == pytest.approx(w_last + 3 * tau[-1])
    idle = summarize(trace).bubble_per_rank
    assert idle == pytest.approx([max(0, a - b) + a + b * n, a + max(0, b - a) + tau[-1]])
