"""The simulator against a second interpreter of the IR written here from :mod:`vpp.schedules.engine`'s
stated semantics, not its code: every compute of every strategy's plan ends at the same time.

* blocking: a SEND and its RECV rendezvous; the transfer starts when both ranks stand at them and both
  stay blocked for its duration;
* async (overlap 1): SEND and RECV post and return; a transfer starts once both ends are posted and the
  previous transfer of the same (src, dst) channel has ended; a COMPUTE fed from another rank waits for
  its transfer; the plan ends when every transfer has.
"""

import random

import pytest

from vpp.schedules import LinearCost, Request, STRATEGIES, make_layout, simulate_plan


def reference_ends(plan, duration, latency):
    acts, ranks, blocking = plan.actions, plan.layout.stage_ranks, plan.comm == "blocking"
    ptr, clock = [0] * plan.num_ranks, [0.0] * plan.num_ranks
    posted, arrived, ends, waiting = {}, {}, {}, set()
    channel = {}
    for r, rank_acts in enumerate(acts):
        for a in rank_acts:
            if a.op == "S":
                channel.setdefault((r, a.peer), []).append(a.key)
    before = {k: (ch[i - 1] if i else None) for ch in channel.values() for i, k in enumerate(ch)}
    while any(p < len(a) for p, a in zip(ptr, acts)):
        moved = False
        for r in range(plan.num_ranks):
            while ptr[r] < len(acts[r]):
                a = acts[r][ptr[r]]
                if a.op == "F":
                    start = clock[r]
                    if a.stage and ranks[a.stage - 1] != r:
                        feed = (a.stage - 1, a.request, a.chunk)
                        if feed not in arrived:
                            break
                        start = max(start, arrived[feed])
                    clock[r] = ends[a.key] = start + duration(a.stage, a.request, a.chunk)
                elif a.op in "SR" and blocking:
                    p = a.peer
                    peer_at = acts[p][ptr[p]] if ptr[p] < len(acts[p]) else None
                    if a.op == "R" or peer_at is None or (peer_at.op, peer_at.key) != ("R", a.key):
                        break
                    clock[r] = clock[p] = arrived[a.key] = max(clock[r], clock[p]) + latency
                    ptr[p] += 1
                elif a.op in "SR":
                    posted[(a.op, a.key)] = clock[r]
                    waiting.add(a.key)
                ptr[r] += 1
                moved = True
        ready = [k for k in waiting if ("S", k) in posted and ("R", k) in posted
                 and (before[k] is None or before[k] in arrived)]
        for k in ready:
            arrived[k] = max(posted[("S", k)], posted[("R", k)], arrived.get(before[k], 0.0)) + latency
            waiting.discard(k)
        assert moved or ready, "the reference interpreter is stuck"
    return ends, max(clock + list(arrived.values()))


def random_case(seed):
    rng = random.Random(seed)
    name = rng.choice(["cpp", "cpp-async", "vpp", "vpp-async", "vpp-packed", "vpp-async-pipelined"])
    strategy = STRATEGIES[name]
    pp = rng.randint(1, 4)
    folds = 1 if strategy.layout == "loop" else rng.choice([1, 1, 2])
    stages = pp if strategy.layout == "loop" else 2 * folds * pp
    requests = [Request(i, tuple(rng.randint(1, 20) for _ in range(rng.randint(1, 5)))) for i in range(rng.randint(1, 3))]
    cost = LinearCost(per_chunk=rng.uniform(0, 1), per_token=0.1, per_token_prefix=rng.uniform(0, 0.01),
                      stage_weights=tuple(rng.uniform(0.5, 2) for _ in range(stages)),
                      latency=rng.choice([0.0, 0.3, 2.0]))
    plan = strategy.plan(make_layout(strategy.layout, stages, pp, folds=folds), requests)
    return plan, cost


@pytest.mark.parametrize("seed", range(40))
def test_every_compute_ends_when_the_reference_says(seed):
    plan, cost = random_case(seed)
    by_id = {q.id: q for q in plan.requests}
    ends, makespan = reference_ends(plan, lambda s, q, c: cost.compute(s, by_id[q].tokens(c), by_id[q].offset(c)),
                                    cost.latency)
    trace = simulate_plan(plan, cost)
    got = {(s.stage, s.request, s.chunk): s.end for s in trace.of(kind="compute")}
    assert got == pytest.approx(ends)
    assert trace.makespan == pytest.approx(makespan)
