"""The plan verifier. A plan is correct when

1. every action names a stage the rank holds, a real peer, request and chunk;
2. every compute of every (stage, request, chunk) appears exactly once, and every activation that
   feeds a next stage is handed off locally or sent and received exactly once;
3. on its rank, every compute comes after its input (the RECV or HANDOFF of the previous stage) and
   after the same stage's previous chunk (KV cache), and every SEND/HANDOFF after its compute;
4. for each rank pair, the sender's SENDs and the receiver's RECVs list the transfers in the same order;
5. shared steps (``Plan.steps``): on each stage a step's pieces are computed back to back in the
   step's order; only the lead sends or hands over (after every piece's compute), and every piece's
   compute comes after the lead's RECV or HANDOFF;
6. it cannot deadlock under its communication semantics: blocking plans are run with rendezvous
   semantics (and non-blocking ones), async plans with non-blocking ones (see :mod:`.engine`); since
   which send matches which receive is fixed, one run decides it for every timing. The run includes
   the admission gate of ``Plan.concurrency`` (a request held until one listed later on the same rank
   finishes is a deadlock).

A broken plan raises :class:`PlanError` with the rank x step grid and the offending cells marked.
"""

from __future__ import annotations

from collections import defaultdict

from .engine import Engine, Stuck
from .ir import COMPUTE, HANDOFF, RECV, SEND, Action, Plan


class PlanError(ValueError):
    def __init__(self, plan: Plan, message: str, marks: list[tuple[int, int]]):
        self.plan, self.marks, self.reason = plan, marks, message
        super().__init__(f"{message}\n{plan.format_grid(mark=marks)}")


def verify(plan: Plan, *, semantics: str | None = None) -> Plan:
    """Check ``plan`` (see the module docstring); returns it, or raises :class:`PlanError`.
    ``semantics`` overrides the plan's own ("blocking", "async" or the stricter "serial"); a blocking
    plan is by default also checked with non-blocking semantics."""
    _check_actions(plan)
    where = _check_coverage(plan)
    _check_local_order(plan)
    _check_fifo(plan, where)
    modes = [semantics] if semantics else (["blocking", "async"] if plan.comm == "blocking" else ["async"])
    for mode in modes:
        _check_progress(plan, mode)
    return plan


def _check_actions(plan: Plan) -> None:
    layout, chunks = plan.layout, {q.id: q.num_chunks for q in plan.requests}
    for r, acts in enumerate(plan.actions):
        for i, a in enumerate(acts):
            problem = None
            if a.stage >= layout.num_stages:
                problem = f"stage {a.stage} does not exist ({layout.num_stages} stages)"
            elif a.request not in chunks:
                problem = f"request {a.request} is not in the plan (ids {sorted(chunks)})"
            elif a.chunk >= chunks[a.request]:
                problem = f"request {a.request} has {chunks[a.request]} chunks, not chunk {a.chunk}"
            else:
                problem = _placement_problem(plan, r, a)
            if problem:
                raise PlanError(plan, f"rank {r} step {i}: {a}: {problem}", [(r, i)])


def _placement_problem(plan: Plan, r: int, a: Action) -> str | None:
    layout = plan.layout
    held = layout.stages_of(r)
    if a.op in (COMPUTE, SEND, HANDOFF) and layout.rank_of(a.stage) != r:
        return f"stage {a.stage} is on rank {layout.rank_of(a.stage)}; rank {r} holds stages {held}"
    if a.op != COMPUTE and a.stage == layout.last_stage:
        return f"stage {a.stage} is the last stage; its output is not passed on"
    if a.op == HANDOFF and not layout.is_local_hop(a.stage):
        return f"stage {a.stage + 1} is on rank {layout.rank_of(a.stage + 1)}, so stage {a.stage}'s output must be sent"
    if a.op == SEND and a.peer != layout.rank_of(a.stage + 1):
        return f"stage {a.stage + 1} (the consumer) is on rank {layout.rank_of(a.stage + 1)}, not rank {a.peer}"
    if a.op == RECV and layout.rank_of(a.stage + 1) != r:
        return f"stage {a.stage + 1} (the consumer) is on rank {layout.rank_of(a.stage + 1)}, not rank {r}"
    if a.op == RECV and a.peer != layout.rank_of(a.stage):
        return f"stage {a.stage} (the producer) is on rank {layout.rank_of(a.stage)}, not rank {a.peer}"
    if a.op in (SEND, RECV) and a.peer == r:
        return "a rank does not send to itself; adjacent stages on one rank use a HANDOFF"
    return None


def _check_coverage(plan: Plan) -> dict:
    """Each action once; each SEND has its RECV and vice versa; nothing missing. Returns
    (op, stage, request, chunk) -> (rank, step)."""
    where: dict = {}
    for r, acts in enumerate(plan.actions):
        for i, a in enumerate(acts):
            if (a.op, *a.key) in where:
                r0, i0 = where[(a.op, *a.key)]
                raise PlanError(plan, f"{a} appears twice: rank {r0} step {i0} and rank {r} step {i}", [(r0, i0), (r, i)])
            where[(a.op, *a.key)] = (r, i)
    for (op, *key), (r, i) in where.items():
        if op != COMPUTE and not plan.step_pieces(key[1], key[2]):
            lead = plan.lead(key[1], key[2])
            raise PlanError(plan, f"{plan.actions[r][i]} on rank {r} (step {i}): r{key[1]}.c{key[2]} shares the step "
                                  f"led by r{lead[0]}.c{lead[1]}, whose transfer or hand-over carries it", [(r, i)])
        if op in (SEND, RECV):
            other = RECV if op == SEND else SEND
            if (other, *key) not in where:
                a = plan.actions[r][i]
                peer_action = Action(other, *key, r)
                raise PlanError(plan, f"{a} on rank {r} (step {i}) has no matching {peer_action} on rank {a.peer}",
                                [(r, i)])
    layout = plan.layout
    for q in plan.requests:
        for c in range(q.num_chunks):
            for s in range(layout.num_stages):
                missing = [(COMPUTE, s)]
                if s < layout.last_stage and plan.step_pieces(q.id, c):
                    missing.append((HANDOFF, s) if layout.is_local_hop(s) else (SEND, s))
                for op, st in missing:
                    if (op, st, q.id, c) not in where:
                        rank = layout.rank_of(st)
                        a = Action(op, st, q.id, c, None if op in (COMPUTE, HANDOFF) else layout.rank_of(st + 1))
                        raise PlanError(plan, f"{a} is missing: rank {rank} never runs it",
                                        [(rank, len(plan.actions[rank]) - 1)] if plan.actions[rank] else [])
    return where


def _check_local_order(plan: Plan) -> None:
    for r, acts in enumerate(plan.actions):
        done, inputs = set(), set()
        for i, a in enumerate(acts):
            need = None
            if a.op == COMPUTE:
                lead = plan.lead(a.request, a.chunk)
                if a.stage > 0 and (a.stage - 1, *lead) not in inputs:
                    need = f"its input, stage {a.stage - 1}'s output (a RECV or HANDOFF), earlier on rank {r}"
                elif a.chunk > 0 and (a.stage, a.request, a.chunk - 1) not in done:
                    need = f"F{a.stage}.r{a.request}.c{a.chunk - 1} (the KV cache of the previous chunk) first"
                elif lead != (a.request, a.chunk):
                    step = plan.step_pieces(*lead)
                    before = step[step.index((a.request, a.chunk)) - 1]
                    if i == 0 or acts[i - 1] != Action(COMPUTE, a.stage, *before):
                        need = f"F{a.stage}.r{before[0]}.c{before[1]} right before it (the pieces of a step run back to back)"
                done.add(a.key)
            elif a.op in (SEND, HANDOFF):
                gone = [p for p in plan.step_pieces(a.request, a.chunk) if (a.stage, *p) not in done]
                if gone:
                    need = (f"F{a.stage}.r{gone[0][0]}.c{gone[0][1]}, which produces "
                            f"{'it' if gone[0] == (a.request, a.chunk) else 'a piece of its step'}, earlier on rank {r}")
                if a.op == HANDOFF:
                    inputs.add(a.key)
            else:
                inputs.add(a.key)
            if need:
                raise PlanError(plan, f"rank {r} step {i}: {a} needs {need}", [(r, i)])


def _check_fifo(plan: Plan, where: dict) -> None:
    sends, recvs = defaultdict(list), defaultdict(list)
    for r, acts in enumerate(plan.actions):
        for i, a in enumerate(acts):
            if a.op == SEND:
                sends[(r, a.peer)].append((a, i))
            elif a.op == RECV:
                recvs[(a.peer, r)].append((a, i))
    for (src, dst), out in sends.items():
        inn = recvs[(src, dst)]
        for n, ((a, i), (b, j)) in enumerate(zip(out, inn)):
            if a.key != b.key:
                raise PlanError(plan, f"rank {src} -> rank {dst}: transfer #{n} is {a} on rank {src} (step {i}) but "
                                      f"{b} on rank {dst} (step {j}); both ends must list a rank pair's "
                                      f"transfers in the same order", [(src, i), (dst, j)])


def _check_progress(plan: Plan, semantics: str) -> None:
    try:
        Engine(plan, semantics).run()
    except Stuck as e:
        parts = []
        for r, i in sorted(e.blocked.items()):
            acts = plan.actions[r]
            if i == len(acts):
                parts.append(f"rank {r} finished its list but waits for its sends to complete")
            else:
                a = acts[i]
                what = f"waits in {a}" if a.is_comm else f"waits for the input of {a}"
                gate = plan.admission_gate(a.request) if a.op == COMPUTE and a.stage == 0 and a.chunk == 0 else None
                if gate is not None:
                    what = (f"holds {a} until request {gate.id} has finished (concurrency {plan.concurrency}), "
                            f"which never happens")
                if a.is_comm:
                    j = e.blocked.get(a.peer, len(plan.actions[a.peer]))
                    other = plan.actions[a.peer][j] if j < len(plan.actions[a.peer]) else "the end of its list"
                    what += f" (rank {a.peer} is at {other})"
                parts.append(f"rank {r} step {i} {what}")
        marks = [(r, min(i, len(plan.actions[r]) - 1)) for r, i in e.blocked.items() if plan.actions[r]]
        raise PlanError(plan, f"deadlock under {semantics} semantics: " + "; ".join(parts), marks) from None


__all__ = ["PlanError", "verify"]
