"""The IR: actions print and parse back, requests know their offsets, plans round-trip through JSON."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vpp.schedules import (COMPUTE, HANDOFF, RECV, SEND, Action, Plan, Request, build_cpp, build_vpp,
                           build_vpp_async, chunk_requests, make_layout)

idx = st.integers(0, 300)


@given(op=st.sampled_from([COMPUTE, SEND, RECV, HANDOFF]), stage=idx, request=idx, chunk=idx, peer=idx)
def test_actions_round_trip(op, stage, request, chunk, peer):
    a = Action(op, stage, request, chunk, peer if op in (SEND, RECV) else None)
    assert Action.parse(str(a)) == a


def test_action_spelling():
    assert str(Action(COMPUTE, 3, 0, 2)) == "F3.r0.c2"
    assert str(Action(SEND, 3, 0, 2, 1)) == "S3>1.r0.c2"
    assert str(Action(RECV, 3, 0, 2, 0)) == "R3<0.r0.c2"
    assert str(Action(HANDOFF, 3, 0, 2)) == "L3.r0.c2"
    assert Action.parse(" R12<7.r3.c40 ") == Action(RECV, 12, 3, 40, 7)


@pytest.mark.parametrize("text", ["F3", "X3.r0.c2", "S3<1.r0.c2", "R3>1.r0.c2", "F3>1.r0.c2", "S3.r0.c2", ""])
def test_bad_actions_do_not_parse(text):
    with pytest.raises(ValueError, match="cannot parse action"):
        Action.parse(text)


def test_action_checks_its_peer():
    with pytest.raises(ValueError, match="send takes a peer"):
        Action(SEND, 1, 0, 0)
    with pytest.raises(ValueError, match="compute takes no peer"):
        Action(COMPUTE, 1, 0, 0, 2)


def test_requests_and_chunking():
    q = Request(4, (8, 8, 3))
    assert (q.length, q.num_chunks, q.offset(0), q.offset(2), q.tokens(2)) == (19, 3, 0, 16, 3)
    reqs = chunk_requests([19, 16, 5], 8)
    assert [r.chunk_sizes for r in reqs] == [(8, 8, 3), (8, 8), (5,)] and [r.id for r in reqs] == [0, 1, 2]
    with pytest.raises(ValueError, match="chunk_size=0"):
        chunk_requests([10], 0)
    with pytest.raises(ValueError, match=r"^chunk_size=2.5 must be an integer >= 1$"):  # was a TypeError
        chunk_requests([10], 2.5)
    with pytest.raises(ValueError, match=r"^prompt lengths \[10, 5.5\] must be integer token counts$"):
        chunk_requests([10, 5.5], 4)
    with pytest.raises(ValueError, match="request 1 has length 0"):
        chunk_requests([10, 0], 4)
    with pytest.raises(ValueError, match="chunk sizes"):
        Request(0, ())
    # 2.5 + 2.5 tokens were truncated to 2 + 2: a 4-token request for a 5-token prompt, silently
    for bad in ((2.5, 2.5), (4, float("nan")), (True, 3)):
        with pytest.raises(ValueError, match=rf"^request 0: chunk sizes .* must be whole token counts, got "):
            Request(0, bad)
    assert Request(0, (8.0, np.int64(3))).chunk_sizes == (8, 3)  # whole numbers of any type stay accepted


@pytest.mark.parametrize("build,kind", [(build_cpp, "loop"), (build_vpp, "v"), (build_vpp_async, "v")])
def test_plans_round_trip_through_json(build, kind):
    plan = build(make_layout(kind, 12, 3), chunk_requests([10, 7], 4))
    text = plan.to_json()
    assert isinstance(json.loads(text)["actions"][0][0], str)
    back = Plan.from_json(text)
    assert back == plan and back.layout == plan.layout and back.comm == plan.comm


def test_grid_prints_ranks_by_steps_and_marks_a_cell():
    plan = build_vpp(make_layout("v", 4, 2), chunk_requests([3], 1))
    grid = plan.format_grid()
    lines = grid.splitlines()
    assert lines[2].startswith("rank 0") and lines[3].startswith("rank 1")
    assert "F0.r0.c0" in lines[2] and "R0<0.r0.c0" in lines[3] and "L1.r0.c0" in lines[3]
    marked = plan.format_grid(mark=(1, 2))
    assert f"[{plan.actions[1][2]}]" in marked and "^^^" in marked
    assert str(plan) == grid
