"""One token budget shared by the requests of a stream: each step carries up to ``budget`` tokens, the
rest of the running request first, then the first chunks of the requests after it, in order, as vLLM's
scheduler builds a batch (running requests, then waiting ones, while the token budget lasts; a request
cut by the budget ends the step). With a DCPP planner every piece is also capped by the planner's
chunk, and the step's time budget is shared as vLLM-Ascend does (#9900): the target less the predicted
time of the pieces already in the step; a request is not added once it is spent.

A request's chunk is its piece of one step. :func:`shared_budget_requests` gives only the chunk lists
(each piece then runs as a step of its own: one hand-over and one per-step overhead per piece);
:func:`shared_budget_stream` also gives the steps, for a plan whose steps are shared (``Plan.steps``,
:mod:`.steps`): one transfer per step carrying all its pieces, the per-step overhead paid once, and one
stage call per piece on real ranks (a stage's caches are keyed by request; a batched call would need a
variable-length attention over several requests' caches). The paper-scale cost model can price a
shared step as the one forward vLLM runs (:mod:`vpp.perf.batched`, ``Setup.batched_steps``): the plan
keeps its pieces, their times sum to the batched step's. A request's next piece is cut to the room
left in the step, as vLLM's scheduler cuts a prefill to the remaining token budget.

With a concurrency limit K (``Plan.concurrency``: request i enters once request i-K has finished) a
request's first piece goes only into a step after the one where request i-K ends (in the same step it
would wait for itself: a deadlock), as vLLM admits a waiting request only once a running slot is free.

All requests are taken as present from the start (arrival 0); the executor's admission gate still
holds a request's first chunk until it arrives, so later arrivals cost time, never correctness.
"""

from __future__ import annotations

from typing import Callable, Iterable

from .dcpp import DcppPlanner
from .ir import Request, is_count

OnStep = Callable[[list[tuple[int, int]]], None]


def shared_budget_steps(lengths: Iterable[int], budget: int, *, planner: DcppPlanner | None = None,
                        on_step: OnStep | None = None, concurrency: int | None = None
                        ) -> list[list[tuple[int, int]]]:
    """The steps of a stream: each a list of (request index, tokens) summing to at most ``budget``.
    ``on_step``, if given, is called after each step is formed with its (tokens, prefix) per piece, before
    the next step is planned (an engine's online calibration: ``planner.observe_step`` on its time).
    ``concurrency``: see the module docstring."""
    lengths = list(lengths)
    if not is_count(budget) or budget < 1:  # a float budget cuts fractional pieces; NaN never fills a step
        raise ValueError(f"budget={budget!r} must be an integer number of tokens >= 1")
    if not all(is_count(n) and n >= 1 for n in lengths):
        raise ValueError(f"prompt lengths {lengths} must be integer token counts >= 1")
    if concurrency is not None and (not is_count(concurrency) or concurrency < 1):
        raise ValueError(f"concurrency={concurrency!r} must be an integer >= 1 (or None: unlimited)")
    budget, lengths = int(budget), [int(n) for n in lengths]
    done = [0] * len(lengths)
    ends: dict[int, int] = {}                  # request index -> the step where it ends
    steps, head = [], 0
    while head < len(lengths):
        left, step, shapes = budget, [], []
        time_left = planner.target if planner is not None else None
        q = head
        while left > 0 and q < len(lengths):
            if concurrency is not None and done[q] == 0 and q >= concurrency and \
                    ends.get(q - concurrency, len(steps)) >= len(steps):
                break                          # no free slot: request q - K ends in this step or later
            rest = lengths[q] - done[q]
            want = rest
            if planner is not None:
                if step and time_left is not None and time_left <= 0:
                    break
                want = planner.next_chunk(done[q], rest, first=done[q] == 0,
                                          time_budget_ms=time_left if step else None)
            n = min(want, left, rest)
            step.append((q, n))
            shapes.append((n, done[q]))
            if planner is not None and time_left is not None:
                time_left -= planner.time(n, done[q]) * 1000.0
            done[q] += n
            left -= n
            if done[q] == lengths[q]:
                ends[q] = len(steps)
            if done[q] < lengths[q]:
                break                      # cut by the budget (or the planner): the step is full
            q += 1
        steps.append(step)
        if on_step is not None:
            on_step(shapes)
        while head < len(lengths) and done[head] == lengths[head]:
            head += 1
    return steps


def shared_budget_requests(lengths: Iterable[int], budget: int, *, planner: DcppPlanner | None = None,
                           arrivals: Iterable[float] | None = None, first_id: int = 0,
                           on_step: OnStep | None = None, concurrency: int | None = None) -> list[Request]:
    """Requests whose chunks are their pieces of :func:`shared_budget_steps` (``on_step``: see there)."""
    return shared_budget_stream(lengths, budget, planner=planner, arrivals=arrivals, first_id=first_id,
                                on_step=on_step, concurrency=concurrency)[0]


def shared_budget_stream(lengths: Iterable[int], budget: int, *, planner: DcppPlanner | None = None,
                         arrivals: Iterable[float] | None = None, first_id: int = 0,
                         on_step: OnStep | None = None, concurrency: int | None = None
                         ) -> tuple[list[Request], list[list[tuple[int, int]]]]:
    """The requests of :func:`shared_budget_requests` and the steps as lists of (request id, chunk),
    for a builder's ``steps`` (:mod:`.builders`); the steps are planned once (``on_step`` sees each)."""
    lengths = list(lengths)
    arrivals = [0.0] * len(lengths) if arrivals is None else list(arrivals)
    sizes: list[list[int]] = [[] for _ in lengths]
    steps = []
    for step in shared_budget_steps(lengths, budget, planner=planner, on_step=on_step, concurrency=concurrency):
        steps.append([(first_id + q, len(sizes[q])) for q, _ in step])
        for q, n in step:
            sizes[q].append(n)
    return [Request(first_id + i, tuple(s), a) for i, (s, a) in enumerate(zip(sizes, arrivals))], steps


__all__ = ["OnStep", "shared_budget_requests", "shared_budget_steps", "shared_budget_stream"]
