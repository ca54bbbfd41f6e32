"""The paper's Table 2 decomposition of a simulated run, as a device profiler would book it.

The view of waiting and why (how it was chosen: section 1 of benchmarks/results/paper_repro.md). The
paper's Tables 1 and 2 are device-profiler categories (Ascend profiler: Computing, Communication not
overlapped, Free, and the overlap ratio = overlapped / all communication time). A profiler sees device tasks, not host intent:
a communication task occupies the device from the moment it is issued until its data has landed, and
time with no task at all is Free. So the model books waiting by *when each plan issues its receive*:

* blocking plans (CPP, DCPP, vanilla VPP): vLLM's PP hand-over (``send_tensor_dict`` /
  ``recv_tensor_dict``) first exchanges metadata on the CPU group, so a receive reaches the device only
  once the sender has arrived: waiting before that is Free (bubble); the transfer itself is
  communication, exposed (no compute runs beside a blocking exchange);
* async plans (VPP-Async, packing) post ``irecv`` / ``isend`` ahead: the receive task runs from its
  post to its data's arrival, so waiting inside it is communication, and the part of it during which
  the rank computes is overlapped (not exposed). A worker can post a step's receive only once the step
  has been dispatched to it (vLLM's model runner issues a step's PP receive inside that step's
  ``execute_model``, and the scheduler dispatches a step to every PP worker when it starts the step),
  so a receive's post is clamped to its step's dispatch, taken as the start of the step's first-stage
  compute: a rank waiting for a request the engine has not yet scheduled is Free, not communication
  (``view="profiler-early"`` keeps the unclamped post, for the what-if);
* a stage's TP collectives run on the compute stream between its kernels: communication, never
  overlapped.

``view="profiler"`` (the default) is that rule; ``view="simulator"`` is the simulator's own (every wait
for a peer's unfinished work is bubble, only wire time counts as communication), for comparison. Both
give the same totals; they move time between bubble and exposed communication and set the overlap
ratio. Per rank::

    computation   = the rank's compute categories, less communication (tp_comm, cp_comm) and launch stalls
    exposed comm. = PP communication outside compute spans + the rank's TP / CP collectives
    bubble        = makespan - computation - exposed comm.   (Free + Launch stall)

Category totals (attention, the MLA prefix rebuild, GEMMs, launches, ...) come with the row, averaged
over ranks; ``launch_stall`` is the part of the bubble the profiler calls "Launch stall".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from vpp.schedules import summarize
from vpp.schedules.ir import COMPUTE

COMM_CATEGORIES = ("tp_comm", "cp_comm")
STALL = "launch_stall"
VIEWS = ("profiler", "profiler-early", "simulator")


@dataclass
class Row:
    name: str
    makespan: float
    compute: float
    bubble: float
    exposed_comm: float
    chunks: int
    categories: dict = field(default_factory=dict)
    overlap_ratio: float = 0.0
    bubble_ratio: float = 0.0
    comm_total: float = 0.0

    @property
    def total(self) -> float:
        return self.makespan

    @property
    def launch_stall(self) -> float:
        return self.categories.get(STALL, 0.0)

    @property
    def free(self) -> float:
        """The bubble less launch stalls: device idle with nothing issued (Table 2(c) "Free")."""
        return self.bubble - self.launch_stall

    def to_dict(self) -> dict:
        return {"name": self.name, "total": self.makespan, "compute": self.compute, "bubble": self.bubble,
                "exposed_comm": self.exposed_comm, "chunks": self.chunks, "categories": self.categories,
                "overlap_ratio": self.overlap_ratio, "bubble_ratio": self.bubble_ratio,
                "comm_total": self.comm_total, "free": self.free, "launch_stall": self.launch_stall}


def rank_categories(plan, cost) -> list[dict]:
    """Per rank, seconds per cost category over all of the rank's compute actions."""
    requests = {q.id: q for q in plan.requests}
    out = []
    for acts in plan.actions:
        cats: dict = defaultdict(float)
        for a in acts:
            if a.op != COMPUTE:
                continue
            q = requests[a.request]
            for k, v in cost.breakdown(a.stage, q.tokens(a.chunk), q.offset(a.chunk)).items():
                cats[k] += v
        out.append(dict(cats))
    return out


def _union(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _intersection(xs, ys) -> float:
    """Total length of the overlap of two sorted lists of disjoint intervals."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def dispatch_times(plan, trace) -> dict:
    """When each step was dispatched to the workers, by (request, chunk): the start of its first-stage
    compute (a shared step's: its lead's, whose first-stage call opens the step)."""
    first = {(s.request, s.chunk): s.start for s in trace.spans if s.kind == "compute" and s.stage == 0}
    if not plan.steps:
        return first
    return {(q, c): first[plan.lead(q, c)] for q, c in first}


def pp_comm_intervals(plan, trace, rank: int, view: str, dispatch: dict | None = None) -> list[tuple[float, float]]:
    """The rank's PP communication as the view sees it (see the module docstring): each transfer's
    wire time, from its post where an async plan posted it ahead (profiler views), the post no earlier
    than the step's dispatch (``view="profiler"``; ``dispatch`` from :func:`dispatch_times`, computed
    when not given)."""
    posts: dict = {}
    if view != "simulator" and plan.comm == "async":
        if view == "profiler" and dispatch is None:
            dispatch = dispatch_times(plan, trace)
        for s in trace.spans:
            if s.rank == rank and s.kind in ("send", "recv") and s.stage is not None:
                post = min(posts.get(s.key, s.start), s.start)
                if view == "profiler":
                    post = max(post, dispatch.get((s.request, s.chunk), post))
                posts[s.key] = post
    out = []
    for s in trace.spans:
        if s.rank == rank and s.kind == "transfer":
            out.append((min(posts.get(s.key, s.start), s.start), s.end))
    return _union(out)


def decompose(name: str, plan, trace, cost, *, view: str = "profiler") -> Row:
    """The paper-style row (per-rank means) of a simulated ``plan``/``trace`` under ``cost``."""
    if view not in VIEWS:
        raise ValueError(f"view={view!r}; expected one of {VIEWS}")
    s = summarize(trace)
    cats = rank_categories(plan, cost)
    n = plan.num_ranks
    compute = exposed = overlapped = comm_total = 0.0
    dispatch = dispatch_times(plan, trace) if view == "profiler" and plan.comm == "async" else None
    for r in range(n):
        c = cats[r]
        coll = sum(c.get(k, 0.0) for k in COMM_CATEGORIES)
        compute += sum(v for k, v in c.items() if k not in COMM_CATEGORIES and k != STALL)
        busy = _union((sp.start, sp.end) for sp in trace.spans if sp.rank == r and sp.kind == "compute")
        if view != "simulator":
            pp = pp_comm_intervals(plan, trace, r, view, dispatch)
            hidden = _intersection(pp, busy)
            exposed += _length(pp) - hidden + coll
            overlapped += hidden
            comm_total += _length(pp) + coll
        else:
            exposed += s.exposed_per_rank[r] + coll
            wire = sum(sp.duration for sp in trace.spans if sp.rank == r and sp.kind == "transfer")
            comm_total += wire + coll
            overlapped += max(0.0, wire - s.exposed_per_rank[r])
    compute, exposed = compute / n, exposed / n
    bubble = max(0.0, s.makespan - compute - exposed)
    mean_cats: dict = defaultdict(float)
    for c in cats:
        for k, v in c.items():
            mean_cats[k] += v / n
    overlap = overlapped / comm_total if comm_total > 0 else 0.0
    chunks = sum(q.num_chunks for q in plan.requests)
    return Row(name, s.makespan, compute, bubble, exposed, chunks, dict(mean_cats), overlap_ratio=overlap,
               bubble_ratio=bubble / s.makespan if s.makespan else 0.0, comm_total=comm_total / n)


__all__ = ["COMM_CATEGORIES", "Row", "STALL", "VIEWS", "decompose", "dispatch_times", "pp_comm_intervals",
           "rank_categories"]
