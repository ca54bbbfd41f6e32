"""Every strategy's plan against an independent reading of the IR (no :mod:`vpp.schedules.verify` or
:mod:`vpp.schedules.engine`): each (stage, chunk) computed once on its rank, after its input and after the
same stage's previous chunk (KV cache); a SEND/RECV pair for every hop between ranks and a HANDOFF, with
no transfer, for every hop within one (the V's fold: rank P-1 runs stages P-1 and P of a chunk with no
other compute or send in between); transfers listed in the same order on both ends; and the plan runs
to the end with rendezvous send/recv (blocking plans) and with isend/irecv (all plans)."""

from collections import defaultdict

import pytest

from vpp.schedules import Request, STRATEGIES, chunk_requests, make_layout, replace_actions


def positions(plan):
    pos = {}
    for r, acts in enumerate(plan.actions):
        for i, a in enumerate(acts):
            key = (a.op, a.stage, a.request, a.chunk)
            assert key not in pos, f"{a} twice"
            pos[key] = (r, i)
    return pos


def check_dataflow(plan):
    ranks, pos = plan.layout.stage_ranks, positions(plan)
    last, count = len(ranks) - 1, 0
    for q in plan.requests:
        for c in range(q.num_chunks):
            for s in range(last + 1):
                r, i = pos[("F", s, q.id, c)]
                assert r == ranks[s]
                count += 1
                if c:
                    assert pos[("F", s, q.id, c - 1)] < (r, i), f"KV order of stage {s}, chunk {c}"
                if s == last:
                    assert not any((op, s, q.id, c) in pos for op in "SRL")
                    continue
                r2, i2 = pos[("F", s + 1, q.id, c)]
                if ranks[s] == ranks[s + 1]:
                    assert ("S", s, q.id, c) not in pos and ("R", s, q.id, c) not in pos
                    assert i < pos[("L", s, q.id, c)][1] < i2
                    count += 1
                else:
                    (sr, si), (rr, ri) = pos[("S", s, q.id, c)], pos[("R", s, q.id, c)]
                    assert (sr, rr) == (r, r2) and si > i and ri < i2 and ("L", s, q.id, c) not in pos
                    assert plan.actions[sr][si].peer == rr and plan.actions[rr][ri].peer == sr
                    count += 2
    assert count == sum(len(a) for a in plan.actions), "actions beyond the dataflow"


def check_fifo(plan):
    sends, recvs = defaultdict(list), defaultdict(list)
    for r, acts in enumerate(plan.actions):
        for a in acts:
            if a.op == "S":
                sends[(r, a.peer)].append(a.key)
            elif a.op == "R":
                recvs[(a.peer, r)].append(a.key)
    assert sends == recvs


def runs_to_the_end(plan, blocking):
    """Rendezvous: a SEND completes with the peer standing at the matching RECV. Non-blocking: SEND and
    RECV post and go on; a COMPUTE fed from another rank waits until that SEND was posted."""
    acts, ptr, sent, ranks = plan.actions, [0] * plan.num_ranks, set(), plan.layout.stage_ranks
    while any(p < len(a) for p, a in zip(ptr, acts)):
        moved = False
        for r in range(plan.num_ranks):
            while ptr[r] < len(acts[r]):
                a = acts[r][ptr[r]]
                if a.op == "F" and a.stage and ranks[a.stage - 1] != r and (a.stage - 1, a.request, a.chunk) not in sent:
                    break
                if a.op == "R" and blocking:
                    break                                   # completed by the sender's rendezvous
                if a.op == "S":
                    if blocking:
                        p = a.peer
                        peer_at = acts[p][ptr[p]] if ptr[p] < len(acts[p]) else None
                        if peer_at is None or (peer_at.op, peer_at.key, peer_at.peer) != ("R", a.key, r):
                            break
                        ptr[p] += 1
                    sent.add(a.key)
                ptr[r] += 1
                moved = True
        assert moved, f"stuck at {[str(a[p]) if p < len(a) else 'end' for p, a in zip(ptr, acts)]}"


def check_fold(plan, pp):
    """f = 1: rank P-1 computes stage P right after stage P-1 of the same chunk."""
    acts = plan.actions[pp - 1]
    for q in plan.requests:
        for c in range(q.num_chunks):
            i = next(j for j, a in enumerate(acts) if a.op == "F" and a.key == (pp - 1, q.id, c))
            k = next(j for j, a in enumerate(acts) if a.op == "F" and a.key == (pp, q.id, c))
            assert not [a for a in acts[i + 1:k] if a.op in "FS"], f"rank {pp - 1} is not back to back at the fold"


REQUESTS = {"one": ([40], 8), "ragged": ([33], 8), "three": ([40, 17, 9], 8), "tiny": ([5, 5, 5], 2)}


CASES = [(name, pp, folds) for name in ("cpp", "dcpp", "vpp", "vpp-async", "vpp-packed", "cpp-async",
                                         "vpp-async-pipelined")
         for pp, folds in ((1, 1), (2, 1), (3, 1), (4, 1), (2, 2), (3, 2))
         if folds == 1 or STRATEGIES[name].layout == "v"]


@pytest.mark.parametrize("name, pp, folds", CASES)
def test_plans_hold_the_dataflow_and_run_to_the_end(name, pp, folds):
    strategy = STRATEGIES[name]
    stages = pp if strategy.layout == "loop" else 2 * folds * pp
    layout = make_layout(strategy.layout, stages + 3, pp, folds=folds)
    for lengths, chunk in REQUESTS.values():
        requests = chunk_requests(lengths, chunk)
        if strategy.chunking == "dcpp":   # shrinking chunks, as a DCPP planner cuts them
            requests = [Request(q.id, (q.length - q.length // 3, q.length // 3 - 1, 1) if q.length > 5
                                else q.chunk_sizes) for q in requests]
        for concurrency in (None, 1, 2):
            plan = strategy.plan(layout, requests, concurrency=concurrency)
            check_dataflow(plan)
            check_fifo(plan)
            runs_to_the_end(plan, blocking=False)
            if plan.comm == "blocking":
                runs_to_the_end(plan, blocking=True)
            if strategy.layout == "v" and folds == 1:
                check_fold(plan, pp)


def test_the_checks_catch_a_planted_deadlock_and_a_crossed_pair():
    """Rank 1 sends s2/C0 before receiving s0/C1 while rank 0 sends s0/C1 first: rendezvous deadlocks,
    isend/irecv does not. Receiving C2 before C1 crosses the pair's order."""
    plan = STRATEGIES["vpp"].plan(make_layout("v", 8, 2), chunk_requests([400], 100))
    acts = [list(a) for a in plan.actions]
    i, j = (next(k for k, a in enumerate(acts[1]) if str(a) == t) for t in ("R0<0.r0.c1", "S2>0.r0.c0"))
    acts[1][i], acts[1][j] = acts[1][j], acts[1][i]
    bad = replace_actions(plan, acts)
    runs_to_the_end(bad, blocking=False)
    with pytest.raises(AssertionError, match="stuck at"):
        runs_to_the_end(bad, blocking=True)
    acts = [list(a) for a in plan.actions]
    i, j = (next(k for k, a in enumerate(acts[1]) if str(a) == t) for t in ("R0<0.r0.c1", "R0<0.r0.c2"))
    acts[1][i], acts[1][j] = acts[1][j], acts[1][i]
    with pytest.raises(AssertionError):
        check_fifo(replace_actions(plan, acts))
