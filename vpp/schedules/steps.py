"""Plans whose steps are shared by requests (``Plan.steps``, see :mod:`.ir`), from any builder.

A stream cut by one token budget (:mod:`.shared_budget`) is a sequence of steps, each a list of
(request, chunk) pieces. The pipeline moves steps, not pieces: each step goes through every stage as one
unit of work and one transfer. So a builder schedules the steps as the chunks of one *step request*
(chunk k = step k, its tokens the step's), which is exactly the order constraint a step stream has:
step k runs after step k-1 on every stage (each request's pieces lie in increasing steps, so each
request's KV-cache order holds too). The step plan is then expanded: a COMPUTE of step k becomes one
COMPUTE per piece, back to back in step order (one stage call per request piece: a stage's caches are
keyed by request, see :mod:`vpp.runtime.executor`), and a SEND/RECV/HANDOFF of step k becomes the same
action named by the step's lead piece, carrying the whole step. What each piece's COMPUTE costs is the
cost model's (:func:`.cost.piece_times`: separate calls, or shares of one batched forward).

Admission (``Plan.concurrency`` K): request i enters once request i-K has finished. In the step
request that is a gate of step k_i (request i's first) on the last stage's compute of step e (where
request i-K ends), which the builder list-schedules (so on a V, where both run on rank 0, the program
order holds it); k_i must come after e (:func:`.shared_budget.shared_budget_stream` with the same
``concurrency`` guarantees it).

A stream of one-piece steps is a valid input too; it yields a plan without ``Plan.steps`` entries.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .ir import COMPUTE, Action, Plan, Request
from .layout import Layout
from .order import Task

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


def step_gates(layout: Layout, requests: Sequence[Request], steps: Sequence[Sequence[Piece]],
               concurrency: int | None) -> dict[Task, Task]:
    """The admission gates of ``concurrency`` as gates between the step request's tasks."""
    if concurrency is None:
        return {}
    first, last = {}, {}
    for k, g in enumerate(steps):
        for q, _ in g:
            first.setdefault(q, k)
            last[q] = k
    gates = {}
    for i in range(concurrency, len(requests)):
        q, before = requests[i].id, requests[i - concurrency].id
        if first[q] <= last[before]:
            raise ValueError(f"request {q} starts in step {first[q]} but under concurrency {concurrency} waits for "
                             f"request {before}, which ends in step {last[before]}: a deadlock (cut the stream "
                             f"with the same concurrency, shared_budget_stream(..., concurrency={concurrency}))")
        gates[Task(0, 0, first[q])] = Task(layout.last_stage, 0, last[before])
    return gates


def build_with_steps(build: Callable[..., Plan], layout: Layout, requests: Sequence[Request],
                     steps: Sequence[Sequence[Piece]], *, concurrency: int | None = None, **kw) -> Plan:
    """``build(layout, [step request], gates=..., **kw)`` expanded into a plan of ``requests`` with
    shared steps; ``concurrency`` applies to the real requests (see the module docstring)."""
    requests = tuple(requests)
    steps = check_steps(requests, steps)
    gates = step_gates(layout, requests, steps, concurrency)
    return expand_steps(build(layout, [step_request(requests, steps)], gates=gates, **kw), requests, steps,
                        concurrency=concurrency)


__all__ = ["Piece", "build_with_steps", "check_steps", "expand_steps", "step_gates", "step_request"]
