"""Plan checks shared by the builder and packing tests."""

from collections import Counter

from vpp.schedules import COMPUTE, HANDOFF, RECV, SEND


def check_runs_everything_once(plan):
    layout, counts = plan.layout, Counter()
    for rank, acts in enumerate(plan.actions):
        for a in acts:
            counts[(a.op, a.key)] += 1
            assert layout.rank_of(a.stage if a.op != RECV else a.stage + 1) == rank
    assert all(n == 1 for n in counts.values())
    for q in plan.requests:
        for c in range(q.num_chunks):
            for s in range(layout.num_stages):
                assert counts[(COMPUTE, (s, q.id, c))] == 1
                if s < layout.last_stage:
                    local = layout.is_local_hop(s)
                    assert counts[(HANDOFF, (s, q.id, c))] == int(local)
                    assert counts[(SEND, (s, q.id, c))] == counts[(RECV, (s, q.id, c))] == int(not local)
    assert sum(counts.values()) == sum(len(a) for a in plan.actions)
