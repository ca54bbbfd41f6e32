"""Plans whose steps are shared by requests (``Plan.steps``, see :mod:`.ir`), from any builder.

A stream cut by one token budget (:mod:`.shared_budget`) is a sequence of steps, each a list of
(request, chunk) pieces. The pipeline moves steps, not pieces: each step goes through every stage as one
unit of work and one transfer. So a builder schedules the steps as the chunks of one *step request*
(chunk k = step k, its tokens the step's), which is exactly the order constraint a step stream has:
step k runs after step k-1 on every stage (each request's pieces lie in increasing steps, so each
request's KV-cache order holds too). The step plan is then expanded: a COMPUTE of step k becomes one
COMPUTE per piece, back to back in step order (one stage call per request piece: a stage's caches are
keyed by request, see :mod:`vpp.runtime.executor`), and a SEND/RECV/HANDOFF of step k becomes the same
action named by the step's lead piece, carrying the whole step.

A stream of one-piece steps is a valid input too; it yields a plan without ``Plan.steps`` entries.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .ir import COMPUTE, Action, Plan, Request
from .layout import Layout

Piece = tuple[int, int]


def check_steps(requests: Sequence[Request], steps: Sequence[Sequence[Piece]]) -> list[list[Piece]]:
    """``steps`` as lists of (request id, chunk); raises unless every chunk of every request is in
    exactly one step and each request's chunks lie in increasing steps (one chunk per step)."""
    steps = [[(int(q), int(c)) for q, c in g] for g in steps]
    chunks = {q.id: q.num_chunks for q in requests}
    nxt = {q: 0 for q in chunks}
    for i, g in enumerate(steps):
        if not g:
            raise ValueError(f"step {i} is empty")
        seen = set()
        for q, c in g:
            if q not in chunks:
                raise ValueError(f"step {i}: request {q} is not among the requests {sorted(chunks)}")
            if q in seen:
                raise ValueError(f"step {i} holds two chunks of request {q}; a step holds one piece per request")
            seen.add(q)
            if c != nxt[q]:
                raise ValueError(f"step {i}: r{q}.c{c} comes where request {q}'s chunk {nxt[q]} is due "
                                 f"(each request's chunks go into steps in order)")
            nxt[q] += 1
    short = {q: (nxt[q], n) for q, n in chunks.items() if nxt[q] != n}
    if short:
        raise ValueError(f"steps cover only part of some requests (request: (chunks in steps, chunks)): {short}")
    return steps


def step_request(requests: Sequence[Request], steps: Sequence[Sequence[Piece]]) -> Request:
    """The step request: chunk k is step k, of the step's tokens."""
    sizes = {q.id: q.chunk_sizes for q in requests}
    return Request(0, tuple(sum(sizes[q][c] for q, c in g) for g in steps))


def expand_steps(step_plan: Plan, requests: Sequence[Request], steps: Sequence[Sequence[Piece]], *,
                 concurrency: int | None = None) -> Plan:
    """The plan of ``requests`` from a plan of their :func:`step_request` (see the module docstring)."""
    actions = []
    for acts in step_plan.actions:
        out = []
        for a in acts:
            pieces = steps[a.chunk]
            if a.op == COMPUTE:
                out.extend(Action(COMPUTE, a.stage, q, c) for q, c in pieces)
            else:
                out.append(Action(a.op, a.stage, pieces[0][0], pieces[0][1], a.peer))
        actions.append(out)
    return Plan(name=step_plan.name, layout=step_plan.layout, requests=tuple(requests), actions=actions,
                comm=step_plan.comm, concurrency=concurrency, steps=tuple(tuple(g) for g in steps if len(g) > 1))


def build_with_steps(build: Callable[..., Plan], layout: Layout, requests: Sequence[Request],
                     steps: Sequence[Sequence[Piece]], *, concurrency: int | None = None, **kw) -> Plan:
    """``build(layout, [step request], **kw)`` expanded into a plan of ``requests`` with shared steps.
    ``concurrency`` applies to the real requests (the engine's admission gate)."""
    requests = tuple(requests)
    steps = check_steps(requests, steps)
    return expand_steps(build(layout, [step_request(requests, steps)], **kw), requests, steps,
                        concurrency=concurrency)
