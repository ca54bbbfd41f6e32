"""The verifier catches broken plans and shows them on the grid with the offending cell marked."""

import pytest

from vpp.schedules import Action, PlanError, build_vpp, build_vpp_async, chunk_requests, make_layout, verify
from vpp.schedules.ir import replace_actions


@pytest.fixture
def plan():
    return build_vpp(make_layout("v", 8, 2), chunk_requests([400], 100))


def edited(plan, rank, fn):
    acts = [list(a) for a in plan.actions]
    fn(acts[rank])
    return replace_actions(plan, acts)


def swap(lst, a, b):
    i, j = lst.index(Action.parse(a)), lst.index(Action.parse(b))
    lst[i], lst[j] = lst[j], lst[i]


def test_planted_deadlock_is_caught_with_a_readable_grid(plan):
    # Rank 1 sends s2/C0 before receiving s0/C1, while rank 0 sends s0/C1 before receiving s2/C0:
    # both block in a send (rendezvous), the classic bidirectional deadlock.
    bad = edited(plan, 1, lambda acts: swap(acts, "R0<0.r0.c1", "S2>0.r0.c0"))
    with pytest.raises(PlanError) as err:
        verify(bad)
    text = str(err.value)
    assert "deadlock under blocking semantics" in text
    assert "rank 0 step 3 waits in S0>1.r0.c1 (rank 1 is at S2>0.r0.c0)" in text
    assert "[S0>1.r0.c1]" in text and "[S2>0.r0.c0]" in text and "^^^^^^^^^^^^" in text
    assert set(err.value.marks) == {(0, 3), (1, 4)}
    # Non-blocking sends resolve it; a single in-order queue per rank does not.
    verify(bad, semantics="async")
    with pytest.raises(PlanError, match="deadlock under serial semantics"):
        verify(bad, semantics="serial")


def test_missing_receive_is_caught(plan):
    bad = edited(plan, 1, lambda acts: acts.remove(Action.parse("R0<0.r0.c2")))
    with pytest.raises(PlanError) as err:
        verify(bad)
    assert "S0>1.r0.c2 on rank 0 (step 7) has no matching R0<0.r0.c2 on rank 1" in str(err.value)
    assert "[S0>1.r0.c2]" in str(err.value) and err.value.marks == [(0, 7)]


def test_compute_before_its_input_is_caught(plan):
    bad = edited(plan, 1, lambda acts: swap(acts, "R0<0.r0.c1", "F1.r0.c1"))
    with pytest.raises(PlanError, match=r"F1.r0.c1 needs its input, stage 0's output \(a RECV or HANDOFF\)"):
        verify(bad)


def test_kv_cache_order_is_enforced(plan):
    def move(acts):
        a = acts.pop(acts.index(Action.parse("F0.r0.c2")))
        acts.insert(0, a)
        acts.insert(1, acts.pop(acts.index(Action.parse("S0>1.r0.c2"))))
    with pytest.raises(PlanError, match=r"needs F0.r0.c1 \(the KV cache of the previous chunk\) first"):
        verify(edited(plan, 0, move))


def test_out_of_order_transfers_on_a_rank_pair_are_caught(plan):
    def early(acts):  # receive chunk 2 before chunk 1; rank 0 sends them the other way round
        a = acts.pop(acts.index(Action.parse("R0<0.r0.c2")))
        acts.insert(acts.index(Action.parse("R0<0.r0.c1")), a)
    bad = edited(plan, 1, early)
    with pytest.raises(PlanError, match=r"rank 0 -> rank 1: transfer #1 is S0>1.r0.c1 on rank 0"):
        verify(bad)


@pytest.mark.parametrize("rank,old,new,message", [
    (0, "F3.r0.c1", "F1.r0.c1", "stage 1 is on rank 1; rank 0 holds stages"),
    (0, "S0>1.r0.c1", "S0>0.r0.c1", "stage 1 \\(the consumer\\) is on rank 1, not rank 0"),
    (1, "L1.r0.c1", "S1>0.r0.c1", "stage 2 \\(the consumer\\) is on rank 1, not rank 0"),
    (0, "F3.r0.c1", "F3.r0.c9", "request 0 has 4 chunks, not chunk 9"),
    (0, "F3.r0.c1", "F3.r5.c1", "request 5 is not in the plan"),
    (0, "F3.r0.c1", "F9.r0.c1", "stage 9 does not exist"),
])
def test_misplaced_actions_are_caught(plan, rank, old, new, message):
    def change(acts):
        acts[acts.index(Action.parse(old))] = Action.parse(new)
    with pytest.raises(PlanError, match=message):
        verify(edited(plan, rank, change))


def test_duplicate_and_missing_computes_are_caught(plan):
    with pytest.raises(PlanError, match="F0.r0.c0 appears twice"):
        verify(edited(plan, 0, lambda acts: acts.append(Action.parse("F0.r0.c0"))))
    with pytest.raises(PlanError, match="F3.r0.c3 is missing: rank 0 never runs it"):
        verify(edited(plan, 0, lambda acts: acts.remove(Action.parse("F3.r0.c3"))))


def test_async_plans_also_pass_the_single_queue_check():
    for kind, pp, folds in (("v", 2, 1), ("v", 4, 2), ("interleaved", 3, 1), ("loop", 4, 1)):
        plan = build_vpp_async(make_layout(kind, 4 * pp * folds, pp, folds=folds), chunk_requests([50, 20], 8))
        verify(plan)
        verify(plan, semantics="serial")
