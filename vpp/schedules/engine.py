"""Runs a plan's semantics in virtual time. The verifier runs it with zero durations to prove that a
plan cannot deadlock; the simulator runs it with a cost model to get a timeline.

Semantics (see :mod:`.ir`):

* ``"blocking"`` -- rendezvous: a transfer starts when both the SEND and the RECV have been reached and
  both ranks stay blocked until it ends.
* ``"async"``    -- SEND/RECV post and return (the sender stalls ``(1 - overlap)`` of the transfer time,
  the part that cannot hide behind compute). A transfer starts once both ends are posted and the
  previous transfer on the same (src, dst) channel has ended; a COMPUTE waits for its input; a rank
  finishes once its sends have ended.
* ``"serial"``   -- as async, but each rank's posted operations complete in posting order (one in-order
  queue per rank, as on a single communicator). Stricter; used by the verifier.

Shared steps (``Plan.steps``): a step's transfer or hand-over is its lead's and makes the input of every
piece of the step available at once; a transfer carries the step's tokens.

Which send matches which receive is fixed by the plan, so whether a plan completes does not depend on
durations: a run with zero durations decides deadlock for every timing.

Gates (all semantics): the COMPUTE of stage 0 on chunk 0 of a request starts no earlier than the
request's ``arrival`` and, with ``Plan.concurrency = K``, no earlier than the end of the last compute of
the request K places before it; the rank is blocked until that compute has run (a gate that waits for
a compute listed later on the same rank is a deadlock). Time spent held by a gate is recorded as a
``wait`` span.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .ir import COMPUTE, HANDOFF, RECV, SEND, Action, Plan
from .trace import Span

SEMANTICS = ("blocking", "async", "serial")


@dataclass
class Transfer:
    src: int
    dst: int
    tokens: int
    send_post: float | None = None
    recv_post: float | None = None
    start: float | None = None
    end: float | None = None
    after: list = field(default_factory=list)  # transfers that must end first (channel or stream order)


class Stuck(Exception):
    """The plan cannot progress: ``blocked`` maps each unfinished rank to its step."""

    def __init__(self, blocked: dict[int, int]):
        super().__init__(f"blocked ranks {blocked}")
        self.blocked = blocked


class Engine:
    def __init__(self, plan: Plan, semantics: str | None = None, *,
                 compute_time: Callable[[int, int, int], float] | None = None,
                 transfer_time: Callable[[int], float] | None = None,
                 overlap: float = 1.0, record: bool = False):
        self.plan = plan
        self.semantics = semantics or plan.comm
        if self.semantics not in SEMANTICS:
            raise ValueError(f"semantics={self.semantics!r}; expected one of {SEMANTICS}")
        if not 0.0 <= overlap <= 1.0:
            raise ValueError(f"overlap={overlap} must lie in [0, 1]")
        self.compute_time = compute_time or (lambda s, q, c: 0.0)
        self.transfer_time = transfer_time or (lambda tokens: 0.0)
        self.overlap = overlap
        self.record = record
        self.spans: list[Span] = []
        n = plan.num_ranks
        self.ptr, self.clock, self.finished = [0] * n, [0.0] * n, [False] * n
        self.avail: list[dict] = [{} for _ in range(n)]
        self.sent: list[list] = [[] for _ in range(n)]
        self.transfers = self._transfers()
        self.arrival = {q.id: q.arrival for q in plan.requests}
        self.last = {q.id: (plan.layout.last_stage, q.id, q.num_chunks - 1) for q in plan.requests}
        K = plan.concurrency
        self.gate_on = {q.id: plan.requests[i - K].id for i, q in enumerate(plan.requests) if K and i >= K}
        self.finished_at: dict[int, float] = {}  # request id -> end of its last compute

    def gate(self, request: int) -> float | None:
        """Earliest start of the request's first compute (arrival, admission), None while unknown."""
        ready = self.arrival[request]
        prev = self.gate_on.get(request)
        if prev is not None:
            if prev not in self.finished_at:
                return None
            ready = max(ready, self.finished_at[prev])
        return ready

    def _transfers(self) -> dict:
        out, last_on = {}, {}
        for r, acts in enumerate(self.plan.actions):
            for a in acts:
                if a.op == SEND:
                    out[a.key] = Transfer(r, a.peer, self.plan.step_tokens(a.request, a.chunk))
        for r, acts in enumerate(self.plan.actions):
            for a in acts:
                if a.op not in (SEND, RECV) or a.key not in out:
                    continue
                # async: FIFO per channel, as seen by each end; serial: FIFO per rank
                stream = ("rank", r) if self.semantics == "serial" else (a.op, r, a.peer)
                prev = last_on.get(stream)
                if prev is not None and prev != a.key:
                    out[a.key].after.append(prev)
                last_on[stream] = a.key
        return out

    # -- transfers -------------------------------------------------------------------------------
    def _resolve(self, key) -> float | None:
        """End time of a transfer, or None while it cannot start (iterative: chains can be long)."""
        stack = [key]
        while stack:
            k = stack[-1]
            t = self.transfers[k]
            if t.end is not None:
                stack.pop()
                continue
            if t.send_post is None or t.recv_post is None:
                return None
            ready = [t.send_post, t.recv_post]
            if self.semantics != "blocking":
                waiting = [p for p in t.after if self.transfers[p].end is None]
                if waiting:
                    if waiting[0] in stack:
                        return None  # cyclic queue order: cannot start
                    stack.append(waiting[0])
                    continue
                ready += [self.transfers[p].end for p in t.after]
            t.start = max(ready)
            t.end = t.start + self.transfer_time(t.tokens)
            stack.pop()
        return self.transfers[key].end

    def _span(self, rank, kind, start, end, a: Action | None = None, peer=None) -> None:
        if self.record:
            if a is None:
                self.spans.append(Span(rank, kind, start, end, None, None, None, peer))
            else:
                self.spans.append(Span(rank, kind, start, end, a.stage, a.request, a.chunk, peer))

    # -- one step of one rank ----------------------------------------------------------------------
    def step(self, r: int) -> bool:
        acts = self.plan.actions[r]
        if self.ptr[r] == len(acts):
            return self._finish(r)
        a, now = acts[self.ptr[r]], self.clock[r]
        if a.op == COMPUTE:
            if a.stage == 0 and a.chunk == 0:
                ready = self.gate(a.request)
                if ready is None:
                    return False
                if ready > now:
                    self._span(r, "wait", now, ready, a)
                    now = ready
            if a.stage > 0:
                ready = self.avail[r].get((a.stage - 1, a.request, a.chunk))
                if callable(ready):
                    ready = ready()
                if ready is None:
                    return False
                if ready > now:
                    lead = (a.stage - 1, *self.plan.lead(a.request, a.chunk))
                    src = self.transfers[lead].src
                    self._span(r, "recv", now, ready, Action(RECV, *lead, src), src)
                    now = ready
            end = now + self.compute_time(a.stage, a.request, a.chunk)
            self._span(r, "compute", now, end, a)
            self.clock[r] = end
            if a.key == self.last[a.request]:
                self.finished_at[a.request] = end
        elif a.op == HANDOFF:
            self._make_available(r, a, now)
        elif self.semantics == "blocking":
            t = self.transfers[a.key]
            if a.op == SEND and t.send_post is None:
                t.send_post = now
            if a.op == RECV and t.recv_post is None:
                t.recv_post = now
            end = self._resolve(a.key)
            if end is None:
                return False
            self._span(r, "send" if a.op == SEND else "recv", now, end, a, a.peer)
            if a.op == RECV:
                self._make_available(r, a, end)
            self.clock[r] = end
        elif a.op == SEND:
            t = self.transfers[a.key]
            t.send_post = now
            stall = (1.0 - self.overlap) * self.transfer_time(t.tokens)
            self._span(r, "send", now, now + stall, a, a.peer)
            self.sent[r].append(a.key)
            self.clock[r] = now + stall
        else:  # async RECV: post now, the consumer waits for the end
            self.transfers[a.key].recv_post = now
            self._span(r, "recv", now, now, a, a.peer)
            self._make_available(r, a, lambda k=a.key: self._resolve(k))
        self.ptr[r] += 1
        return True

    def _make_available(self, r: int, a: Action, when) -> None:
        """The input of every piece of the step led by ``a`` is there at ``when`` (a time or a callable)."""
        for q, c in self.plan.step_pieces(a.request, a.chunk):
            self.avail[r][(a.stage, q, c)] = when

    def _finish(self, r: int) -> bool:
        if self.finished[r]:
            return False
        ends = [(self._resolve(k), k) for k in self.sent[r]]
        if any(e is None for e, _ in ends):
            return False
        last = max(ends, default=(self.clock[r], None))
        if last[0] > self.clock[r]:
            t = self.transfers[last[1]]
            self._span(r, "send", self.clock[r], last[0], Action(SEND, *last[1], t.dst), t.dst)
            self.clock[r] = last[0]
        self.finished[r] = True
        return True

    def run(self) -> "Engine":
        """Advance every rank until all finish; raise :class:`Stuck` if none can move."""
        n = self.plan.num_ranks
        while not all(self.finished):
            moved = False
            for r in range(n):
                while self.step(r):
                    moved = True
            if not moved:
                raise Stuck({r: self.ptr[r] for r in range(n) if not self.finished[r]})
        return self


__all__ = ["Engine", "SEMANTICS", "Stuck", "Transfer"]
