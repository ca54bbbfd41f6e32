"""The schedule IR: per rank, an ordered list of actions. Builders only emit it; the executor and the
simulator only interpret it.

Actions (``s`` a stage, ``q`` a request id, ``c`` a chunk index of that request, ``p`` a peer rank)::

    F{s}.r{q}.c{c}      COMPUTE  run stage s on chunk c of request q (it reads and extends the KV cache
                                 of stage s for request q, so chunk c-1 of the same stage must run first)
    S{s}>{p}.r{q}.c{c}  SEND     send stage s's output for (q, c) to rank p, which holds stage s+1
    R{s}<{p}.r{q}.c{c}  RECV     receive stage s's output for (q, c) from rank p, which holds stage s;
                                 stage s+1 on this rank consumes it
    L{s}.r{q}.c{c}      HANDOFF  stage s's output for (q, c) becomes stage s+1's input on this rank
                                 (adjacent stages on one rank, e.g. the fold point of a V: no transfer)

An activation is always named by its PRODUCER stage: ``S3>1.r0.c2`` and ``R3<0.r0.c2`` are the two ends
of one transfer of stage 3's output; it feeds ``F4.r0.c2`` on rank 1. The last stage's output (the
first token's logits) is not sent anywhere.

Communication modes (``Plan.comm``), the semantics an executor must implement:

* ``"blocking"`` -- a SEND returns once its peer has received the data; a RECV returns once the data has
  arrived (synchronous send/recv, vanilla VPP). Builders order each rank's sends and receives so that
  this can never deadlock, even with rendezvous semantics (the verifier simulates it).
* ``"async"``    -- SEND and RECV post non-blocking operations and return at once; a COMPUTE first waits
  for the RECV (or HANDOFF) that feeds it; every send is completed before the plan ends.

In both modes, for every ordered rank pair (src, dst) the plan lists src's SENDs to dst and dst's RECVs
from src in the same order (the verifier checks it), so point-to-point messages can be matched FIFO.

Request streams. A plan may hold several requests; each has its own KV cache on every stage, so the
caches of several requests coexist on a stage (a stage may free request q's cache once it has run q's
last chunk, if nothing is decoded afterwards). Two gates hold back the COMPUTE of stage 0 on chunk 0 of
a request (the moment the request enters the pipeline), and nothing else:

* arrival   -- ``Request.arrival``, seconds from the stream start (the common time origin of all ranks,
  e.g. a barrier): the compute may not start before it. The rank idles until then; that idle is
  "waiting for work", not a bubble of the schedule (see :mod:`.summary`).
* admission -- ``Plan.concurrency = K`` (None: unlimited): requests are admitted in the order of
  ``Plan.requests``, and the i-th may enter only once the (i-K)-th has finished, i.e. the last stage
  has run its last chunk. At most K requests are then in flight (the requests of one plan finish in
  the order given, which every builder guarantees). Where stage 0 and the last stage share a rank (every
  V, any P = 1) builders list that finishing compute earlier on the same rank, so the gate holds by
  program order; on other layouts an executor needs a completion notice from the last stage's rank.

Steps shared by requests (``Plan.steps``). A step may carry chunks of several requests, as vLLM's
scheduler fills one token budget from several requests: ``Plan.steps`` lists such steps, each a tuple
of (request, chunk) pieces; its first piece is the step's *lead*. On every stage the pieces of a step
are computed back to back in the listed order (one COMPUTE per piece: each reads and extends its own
request's KV cache), and the step moves to the next stage as ONE activation, named by the lead: the
lead's SEND/RECV/HANDOFF carries the outputs of all pieces (concatenated in step order), and the other
pieces have no SEND/RECV/HANDOFF of their own. A piece in no listed step is a step by itself, so a
plan without ``steps`` (every plan of one request per step) reads, prints and runs as before. Printed
in a plan's dict as ``"steps": [["r0.c3", "r1.c0"], ...]``, only when there are any.

The order in which a plan interleaves requests is the builder's choice (see :mod:`.builders` and
:mod:`.packing`); the IR only requires what is listed above.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .grid_text import format_grid
from .layout import Layout

COMPUTE, SEND, RECV, HANDOFF = "F", "S", "R", "L"
OPS = (COMPUTE, SEND, RECV, HANDOFF)
OP_NAMES = {COMPUTE: "compute", SEND: "send", RECV: "recv", HANDOFF: "handoff"}
COMM_MODES = ("blocking", "async")

_PIECE = re.compile(r"^r(\d+)\.c(\d+)$")
_PATTERN = re.compile(r"^([FSRL])(\d+)(?:([<>])(\d+))?\.r(\d+)\.c(\d+)$")


@dataclass(frozen=True, order=True)
class Action:
    """One step of one rank: ``op`` on the activation (``stage``, ``request``, ``chunk``), see the module
    docstring. ``peer`` is the other rank of a SEND/RECV and None otherwise."""

    op: str
    stage: int
    request: int
    chunk: int
    peer: int | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}; expected one of {OPS}")
        if (self.peer is None) != (self.op in (COMPUTE, HANDOFF)):
            raise ValueError(f"{OP_NAMES[self.op]} takes {'no' if self.op in (COMPUTE, HANDOFF) else 'a'} "
                             f"peer, got peer={self.peer}")
        if min(self.stage, self.request, self.chunk) < 0 or (self.peer is not None and self.peer < 0):
            raise ValueError(f"negative index in {self.op} stage={self.stage} request={self.request} "
                             f"chunk={self.chunk} peer={self.peer}")

    @property
    def key(self) -> tuple[int, int, int]:
        """The activation (or compute) this action is about: (stage, request, chunk)."""
        return (self.stage, self.request, self.chunk)

    @property
    def is_comm(self) -> bool:
        return self.op in (SEND, RECV)

    def __str__(self) -> str:
        arrow = {SEND: f">{self.peer}", RECV: f"<{self.peer}"}.get(self.op, "")
        return f"{self.op}{self.stage}{arrow}.r{self.request}.c{self.chunk}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        m = _PATTERN.match(text.strip())
        if not m:
            raise ValueError(f"cannot parse action {text!r}; expected e.g. F3.r0.c2, S3>1.r0.c2, "
                             f"R3<0.r0.c2 or L3.r0.c2")
        op, stage, arrow, peer, req, chunk = m.groups()
        if (arrow is not None) != (op in (SEND, RECV)) or (arrow and arrow != (">" if op == SEND else "<")):
            raise ValueError(f"cannot parse action {text!r}: {OP_NAMES[op]} takes "
                             f"{'>peer' if op == SEND else '<peer' if op == RECV else 'no peer'}")
        return cls(op, int(stage), int(req), int(chunk), None if peer is None else int(peer))


def compute(stage: int, request: int, chunk: int) -> Action:
    return Action(COMPUTE, stage, request, chunk)


def send(stage: int, request: int, chunk: int, peer: int) -> Action:
    return Action(SEND, stage, request, chunk, peer)


def recv(stage: int, request: int, chunk: int, peer: int) -> Action:
    return Action(RECV, stage, request, chunk, peer)


def handoff(stage: int, request: int, chunk: int) -> Action:
    return Action(HANDOFF, stage, request, chunk)


def link_group(src: int, dst: int) -> int:
    """Which of two point-to-point groups a transfer src -> dst may use: 0 towards higher ranks, 1 towards
    lower ranks. Each group then carries one direction per rank pair (see ``build_vpp_async``)."""
    return 0 if src < dst else 1


@dataclass(frozen=True)
class Request:
    """One prompt, cut into chunks. Chunk ``c`` covers tokens ``[offset(c), offset(c) + chunk_sizes[c])``
    and attends to a prefix of ``offset(c)`` cached tokens. ``arrival``: seconds from the stream start
    before which the request cannot enter the pipeline (see the module docstring). ``cached``: tokens
    of the prompt already in every stage's caches before the first chunk (a shared prefix, or caches
    imported from another engine); the chunks cover the rest, so ``offset(0) == cached`` and
    ``length == cached + sum(chunk_sizes)``."""

    id: int
    chunk_sizes: tuple[int, ...]
    arrival: float = 0.0
    cached: int = 0
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)  # offset of every chunk, and the end

    def __post_init__(self) -> None:
        bad = [n for n in self.chunk_sizes if isinstance(n, bool) or not isinstance(n, numbers.Real)
               or not math.isfinite(n) or int(n) != n]
        if bad:  # int() would truncate 2.5 to 2: a request shorter than its prompt, silently
            raise ValueError(f"request {self.id}: chunk sizes {list(self.chunk_sizes)} must be whole token counts, "
                             f"got {bad[0]!r}")
        object.__setattr__(self, "chunk_sizes", tuple(int(n) for n in self.chunk_sizes))
        object.__setattr__(self, "arrival", float(self.arrival))
        if isinstance(self.cached, bool) or int(self.cached) != self.cached or self.cached < 0:
            raise ValueError(f"request {self.id}: cached={self.cached!r} must be a token count >= 0")
        object.__setattr__(self, "cached", int(self.cached))
        if self.id < 0:
            raise ValueError(f"request id {self.id} must be >= 0")
        if not (self.arrival >= 0.0 and math.isfinite(self.arrival)):
            raise ValueError(f"request {self.id}: arrival={self.arrival} must be a finite time >= 0 (seconds from "
                             f"the stream start)")
        if not self.chunk_sizes or min(self.chunk_sizes) < 1:
            raise ValueError(f"request {self.id}: chunk sizes {list(self.chunk_sizes)} must be >= 1 tokens "
                             f"and at least one chunk")
        starts = [self.cached]
        for n in self.chunk_sizes:
            starts.append(starts[-1] + n)
        object.__setattr__(self, "_starts", tuple(starts))

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_sizes)

    @property
    def length(self) -> int:
        """The prompt's tokens, cached prefix included."""
        return self._starts[-1]

    @property
    def new_tokens(self) -> int:
        """The tokens this request prefills (its chunks)."""
        return self._starts[-1] - self.cached

    def offset(self, chunk: int) -> int:
        """Tokens before chunk ``chunk`` (the cached prefix included); ``offset(num_chunks) == length``."""
        if not 0 <= chunk <= len(self.chunk_sizes):
            raise IndexError(f"request {self.id}: chunk {chunk} of {len(self.chunk_sizes)}")
        return self._starts[chunk]

    def tokens(self, chunk: int) -> int:
        return self.chunk_sizes[chunk]

    def to_dict(self) -> dict:
        d = {"id": self.id, "chunk_sizes": list(self.chunk_sizes)}
        if self.arrival:
            d["arrival"] = self.arrival
        if self.cached:
            d["cached"] = self.cached
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Request":
        return cls(d["id"], tuple(d["chunk_sizes"]), d.get("arrival", 0.0), d.get("cached", 0))


def merge_tail(sizes: Sequence[int], threshold: int) -> list[int]:
    """``sizes`` with a final chunk smaller than ``threshold`` tokens joined to the one before (the
    merged chunk exceeds the budget by less than ``threshold``; SGLang PR #23621's tiny-tail case)."""
    sizes = [int(n) for n in sizes]
    if threshold < 0:
        raise ValueError(f"merge_tail threshold={threshold} must be >= 0 tokens")
    if len(sizes) > 1 and sizes[-1] < threshold:
        sizes[-2:] = [sizes[-2] + sizes[-1]]
    return sizes


def is_count(x) -> bool:
    """An integer (Python or numpy), not a bool, not a float, not a string."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def chunk_requests(lengths: Iterable[int], chunk_size: int, *, first_id: int = 0,
                   arrivals: Iterable[float] | None = None, merge_tail_below: int = 0) -> list[Request]:
    """Requests of the given prompt lengths cut into ``chunk_size`` chunks; the last chunk is ragged
    (joined to the one before when smaller than ``merge_tail_below`` tokens, see :func:`merge_tail`).
    ``arrivals`` (one per prompt, default 0) become ``Request.arrival``."""
    if not is_count(chunk_size) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} must be an integer >= 1")
    lengths = list(lengths)
    if not all(is_count(n) for n in lengths):
        raise ValueError(f"prompt lengths {lengths} must be integer token counts")
    arrivals = [0.0] * len(lengths) if arrivals is None else [float(a) for a in arrivals]
    if len(arrivals) != len(lengths):
        raise ValueError(f"{len(arrivals)} arrival times for {len(lengths)} prompts")
    out = []
    for i, (n, at) in enumerate(zip(lengths, arrivals)):
        if n < 1:
            raise ValueError(f"request {first_id + i} has length {n}; prompts need at least one token")
        full, rest = divmod(n, chunk_size)
        sizes = merge_tail((chunk_size,) * full + ((rest,) if rest else ()), merge_tail_below)
        out.append(Request(first_id + i, tuple(sizes), at))
    return out


@dataclass(frozen=True)
class Plan:
    """Per-rank action lists (``actions[rank]``) for ``requests`` on ``layout``, with the communication
    semantics ``comm`` ("blocking" or "async") and the admission limit ``concurrency`` (None: unlimited),
    see the module docstring."""

    name: str
    layout: Layout
    requests: tuple[Request, ...]
    actions: tuple[tuple[Action, ...], ...]
    comm: str = "blocking"
    concurrency: int | None = None
    steps: tuple[tuple[tuple[int, int], ...], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", tuple(self.requests))
        object.__setattr__(self, "steps", tuple(tuple((int(q), int(c)) for q, c in g) for g in self.steps))
        object.__setattr__(self, "actions", tuple(tuple(a) for a in self.actions))
        if self.comm not in COMM_MODES:
            raise ValueError(f"comm={self.comm!r}; expected one of {COMM_MODES}")
        if len(self.actions) != self.layout.num_ranks:
            raise ValueError(f"plan has action lists for {len(self.actions)} ranks, layout has "
                             f"{self.layout.num_ranks}")
        ids = [r.id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"request ids {ids} are not unique")
        if self.concurrency is not None and (int(self.concurrency) != self.concurrency or self.concurrency < 1):
            raise ValueError(f"concurrency={self.concurrency} must be a whole number >= 1 (or None: unlimited)")
        object.__setattr__(self, "_step_of", self._index_steps())
        object.__setattr__(self, "_sizes", {q.id: q.chunk_sizes for q in self.requests})

    def _index_steps(self) -> dict:
        chunks = {q.id: q.num_chunks for q in self.requests}
        step_of: dict = {}
        for i, g in enumerate(self.steps):
            if len(g) < 2:
                raise ValueError(f"step {i} {_pieces_text(g)} lists {len(g)} piece; a shared step holds >= 2 "
                                 f"(a lone piece is a step by itself and is not listed)")
            for q, c in g:
                if q not in chunks or not 0 <= c < chunks[q]:
                    raise ValueError(f"step {i} {_pieces_text(g)}: r{q}.c{c} is not a chunk of the plan "
                                     f"(requests {chunks} with their chunk counts)")
                if (q, c) in step_of:
                    raise ValueError(f"r{q}.c{c} is in steps {step_of[(q, c)][0]} and {i}; a piece is in one step")
                step_of[(q, c)] = (i, g)
        return step_of

    def step_pieces(self, request: int, chunk: int) -> tuple[tuple[int, int], ...]:
        """The (request, chunk) pieces of the step whose lead is (request, chunk); just itself for a
        piece that is a step by itself; () for a piece that is not a lead."""
        i_g = self._step_of.get((request, chunk))
        if i_g is None:
            return ((request, chunk),)
        return i_g[1] if i_g[1][0] == (request, chunk) else ()

    def lead(self, request: int, chunk: int) -> tuple[int, int]:
        """The lead piece of the step holding (request, chunk): the piece whose transfer carries it."""
        i_g = self._step_of.get((request, chunk))
        return (request, chunk) if i_g is None else i_g[1][0]

    def step_tokens(self, request: int, chunk: int) -> int:
        """Tokens of the step led by (request, chunk) (what its transfer carries)."""
        return sum(self._sizes[q][c] for q, c in self.step_pieces(request, chunk))

    def admission_gate(self, request_id: int) -> Request | None:
        """The request that must finish before ``request_id`` may enter (``concurrency`` places earlier
        in ``requests``), or None."""
        if self.concurrency is None:
            return None
        i = [q.id for q in self.requests].index(request_id)
        return self.requests[i - self.concurrency] if i >= self.concurrency else None

    @property
    def num_ranks(self) -> int:
        return self.layout.num_ranks

    @property
    def num_steps(self) -> int:
        return max((len(a) for a in self.actions), default=0)

    def request(self, request_id: int) -> Request:
        for r in self.requests:
            if r.id == request_id:
                return r
        raise KeyError(f"no request {request_id} in plan {self.name!r} (ids {[r.id for r in self.requests]})")

    def computes(self, rank: int) -> list[Action]:
        return [a for a in self.actions[rank] if a.op == COMPUTE]

    def format_grid(self, mark=None, *, start: int | None = None, stop: int | None = None) -> str:
        """The rank x step grid; ``mark`` = (rank, step) or a list of them is shown as ``[cell]`` with a
        ``^`` line below. Without ``start``/``stop`` a marked grid shows a window around the marks."""
        return format_grid(self, mark, start=start, stop=stop)

    def __str__(self) -> str:
        return self.format_grid()

    def to_dict(self) -> dict:
        d = {"name": self.name, "comm": self.comm, "layout": self.layout.to_dict(),
             "requests": [r.to_dict() for r in self.requests],
             "actions": [[str(a) for a in acts] for acts in self.actions]}
        if self.concurrency is not None:
            d["concurrency"] = self.concurrency
        if self.steps:
            d["steps"] = [[f"r{q}.c{c}" for q, c in g] for g in self.steps]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        return cls(name=d["name"], comm=d["comm"], layout=Layout.from_dict(d["layout"]),
                   requests=tuple(Request.from_dict(r) for r in d["requests"]),
                   actions=tuple(tuple(Action.parse(a) for a in acts) for acts in d["actions"]),
                   concurrency=d.get("concurrency"),
                   steps=tuple(tuple(_parse_piece(p) for p in g) for g in d.get("steps", ())))

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))


def replace_actions(plan: Plan, actions: Sequence[Sequence[Action]], **changes) -> Plan:
    """A copy of ``plan`` with other action lists (handy for tests and plan transformations)."""
    fields = dict(name=plan.name, layout=plan.layout, requests=plan.requests, comm=plan.comm,
                  concurrency=plan.concurrency, steps=plan.steps)
    fields.update(changes)
    return Plan(actions=tuple(tuple(a) for a in actions), **fields)


def _pieces_text(pieces) -> str:
    return "[" + ", ".join(f"r{q}.c{c}" for q, c in pieces) + "]"


def _parse_piece(text: str) -> tuple[int, int]:
    m = _PIECE.match(text.strip())
    if not m:
        raise ValueError(f"cannot parse step piece {text!r}; expected e.g. r1.c0")
    return int(m.group(1)), int(m.group(2))


__all__ = [
    "Action", "COMM_MODES", "OPS", "OP_NAMES", "Plan", "Request", "chunk_requests", "compute", "handoff",
    "is_count", "link_group", "merge_tail", "recv", "replace_actions", "send",
]
