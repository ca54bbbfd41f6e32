"""Plan builders: CPP, VPP (Algorithm 1) and VPP-Async. Each one is a priority rule (a key over tasks,
list-scheduled into per-rank compute orders, :mod:`.order`) plus the communication placement pass
(:mod:`.comms`); they emit the IR and nothing else. A packing builder (:mod:`.packing`) passes its own
per-rank orders to :func:`plan_from_orders`.

Request order. Requests enter the pipeline in the order given, and chunks of one request never reorder
on any stage. How consecutive requests meet is ``request_order``:

* ``"pipelined"`` (CPP's default, as vLLM's and SGLang's pipelines do): the chunks of all requests are
  numbered consecutively in one slot key, so a chunk of the next request follows the previous chunk
  through the pipeline with nothing in between; on a loop layout rank 0 starts it as soon as it is free.
* ``"sequential"`` (VPP's and VPP-Async's default): each request is scheduled alone and the per-rank
  orders are concatenated, so the next request's stage 0 on chunk 0 comes after the previous request's
  last compute (last stage, last chunk). In a V both are on rank 0, so this is a program-order
  constraint of rank 0, and the previous request's drain bubble stays idle: what the paper's pipelined
  packing (:func:`.packing.build_vpp_packed`) fills. On layouts whose last stage is on another rank
  (interleaved) the IR cannot hold rank 0 back without a message, and the concatenation only orders each
  rank's own work: the next request may enter while the previous one drains on other ranks.

``concurrency`` K (default None: unlimited) sets ``Plan.concurrency``: request i may enter only once
request i-K has finished (see :mod:`.ir`). Pipelined orders are list-scheduled with that dependency;
sequential orders satisfy it for any K >= 1. Arrival times (``Request.arrival``) never change an
order; the executor and the simulator hold a request's first compute until it arrives.

``steps`` (default None: one request per step) lists steps shared by several requests, e.g. from
:func:`.shared_budget.shared_budget_stream`; the builder then schedules the steps and expands them
(:mod:`.steps`), whatever the request order.
"""

from __future__ import annotations

from typing import Sequence

from .comms import insert_comms
from .ir import COMM_MODES, Plan, Request
from .layout import Layout
from .order import Key, Task, admission_gates, auto_slack, list_schedule, slot_key
from .steps import build_with_steps

REQUEST_ORDERS = ("pipelined", "sequential")


def _requests(requests: Sequence[Request]) -> tuple[Request, ...]:
    requests = tuple(requests)
    if not requests:
        raise ValueError("a plan needs at least one request")
    for q in requests:
        if not isinstance(q, Request):
            raise TypeError(f"expected Request objects, got {q!r} (see chunk_requests)")
    return requests


def plan_from_orders(layout: Layout, requests: Sequence[Request], orders: Sequence[Sequence[Task]], *,
                     comm: str = "blocking", name: str = "plan", starts: dict[Task, float] | None = None,
                     ends: dict[Task, float] | None = None, at: str = "produced",
                     concurrency: int | None = None) -> Plan:
    """A plan from per-rank compute orders (and optionally their nominal start slots, or estimated start
    and end times): places SEND/RECV/HANDOFF with :func:`comms.insert_comms`."""
    if comm not in COMM_MODES:
        raise ValueError(f"comm={comm!r}; expected one of {COMM_MODES}")
    requests = _requests(requests)
    orders = [[Task(*t) for t in o] for o in orders]
    actions = insert_comms(layout, requests, orders, starts=starts, ends=ends, at=at)
    return Plan(name=name, layout=layout, requests=requests, actions=actions, comm=comm, concurrency=concurrency)


def build_plan(layout: Layout, requests: Sequence[Request], *, key: Key | None = None,
               slack: int | None = None, min_slack: int = 0, group: int | None = None,
               comm: str = "blocking", name: str = "plan", request_order: str = "pipelined",
               concurrency: int | None = None, steps=None, gates=None) -> Plan:
    """The generic builder: list-schedule the tasks by ``key`` (:func:`order.list_schedule`), then place
    the communication. The default key is :func:`order.slot_key` with ``slack`` (default: the smallest
    conflict-free slack >= ``min_slack``, :func:`order.auto_slack`) and ``group``. ``request_order`` and
    ``concurrency``: see the module docstring (a custom ``key`` is list-scheduled over all requests at
    once, i.e. "pipelined"); ``steps``: see the module docstring; ``gates``: extra (task -> task it waits
    for) dependencies of the list schedule, added to the admission gates of ``concurrency``."""
    requests = _requests(requests)
    if steps is not None:
        return build_with_steps(build_plan, layout, requests, steps, concurrency=concurrency, key=key, slack=slack,
                                min_slack=min_slack, group=group, comm=comm, name=name, request_order=request_order)
    if request_order not in REQUEST_ORDERS:
        raise ValueError(f"request_order={request_order!r}; expected one of {REQUEST_ORDERS}")
    gates = {**admission_gates(layout, requests, concurrency), **(gates or {})}
    if key is None:
        slack = auto_slack(layout, min_slack, group) if slack is None else slack
        if request_order == "sequential":
            orders, starts = _sequential(layout, requests, lambda qs: slot_key(layout, qs, slack=slack, group=group),
                                         gates)
            return plan_from_orders(layout, requests, orders, comm=comm, name=name, starts=starts,
                                    concurrency=concurrency)
        key = slot_key(layout, requests, slack=slack, group=group)
    orders, starts = list_schedule(layout, requests, key, gates=gates)
    return plan_from_orders(layout, requests, orders, comm=comm, name=name, starts=starts, concurrency=concurrency)


def _sequential(layout: Layout, requests: Sequence[Request], key_for, gates=None
                ) -> tuple[list[list[Task]], dict[Task, int]]:
    """Each request list-scheduled alone (with the ``gates`` within it); per-rank orders concatenated,
    nominal slots shifted so that a request starts when the previous one has ended on every rank."""
    orders: list[list[Task]] = [[] for _ in range(layout.num_ranks)]
    starts: dict[Task, int] = {}
    offset = 0
    for q in requests:
        own, own_starts = list_schedule(layout, [q], key_for([q]),
                                        gates={t: g for t, g in (gates or {}).items() if t.request == q.id == g.request})
        first = min(own_starts.values())
        for r, order in enumerate(own):
            orders[r].extend(order)
        starts.update({t: s - first + offset for t, s in own_starts.items()})
        offset = max(starts.values()) + 1
    return orders, starts


def build_cpp(layout: Layout, requests: Sequence[Request], *, comm: str = "blocking", name: str = "cpp",
              concurrency: int | None = None, steps=None) -> Plan:
    """CPP: every chunk goes through a loop layout (one stage per rank), chunks in order on every rank,
    requests pipelined back to back. Chunk sizes are taken from the requests as they are (fixed, ragged,
    or a DCPP planner's)."""
    if layout.kind != "loop":
        raise ValueError(f"build_cpp runs a loop layout (one stage per rank); got {layout.describe()} -- "
                         f"use build_vpp for folded or interleaved layouts")
    return build_plan(layout, requests, comm=comm, name=name, concurrency=concurrency, steps=steps)


def build_vpp(layout: Layout, requests: Sequence[Request], *, comm: str = "blocking", name: str = "vpp",
              request_order: str = "sequential", concurrency: int | None = None, steps=None) -> Plan:
    """VPP, Algorithm 1 generalised to P ranks and f folds: each rank runs its stages in the order of
    the unit-time slot key with no slack, list-scheduled (:mod:`.order`). On a V with P = 2, while rank
    1 runs s1 and s2 of chunk k, rank 0 runs s3 of chunk k-1 and then s0 of chunk k+1; at every chunk
    boundary both ranks exchange activations (rank 0 sends first, rank 1 receives first, so blocking
    send/recv cannot deadlock). Works on any layout ("interleaved" gives Megatron's forward order); on a
    loop it is CPP. Several requests run one at a time (``request_order="sequential"``, see the module
    docstring).
    """
    return build_plan(layout, requests, slack=0, comm=comm, name=name, request_order=request_order,
                      concurrency=concurrency, steps=steps)


def build_vpp_async(layout: Layout, requests: Sequence[Request], *, name: str = "vpp-async",
                    request_order: str = "sequential", concurrency: int | None = None, steps=None) -> Plan:
    """VPP-Async: the vanilla order with one slot of slack on every remote hop, and non-blocking comm.

    Reordering. In vanilla VPP on a V with P = 2, rank 0 finishes s0/C_k exactly when rank 1 finishes
    s2/C_{k-1}; both then need what the other just sent, so both wait in both directions. Giving every
    remote hop one slot of slack in the unit-time slot key (:func:`order.slot_key`, ``slack=1``) moves
    s0/C_{k+1} ahead of s3/C_{k-1} on rank 0 (the paper's swap). Now rank 0 sends s0/C_{k+1} in the middle
    of rank 1's work on chunk k, and rank 1's s2/C_k output reaches rank 0 while rank 0 computes
    s0/C_{k+2}: every transfer is issued while its receiver computes, the receiver has one compute of
    slack to absorb it, and no rank waits in both directions at once. For general P and folds the same
    slack applies to every link; the RECV is posted when the data is produced (one compute ahead of its
    consumer), the SEND right after its producer.

    Deadlock. The plan uses "async" semantics (isend/irecv, a COMPUTE waits for the RECV that feeds it).
    On one communicator whose point-to-point operations complete in posting order, two ranks that both
    post "send to peer" before "receive from peer" wait on each other forever: each one's receive is
    queued behind its own send, which needs the other's receive. Two alternating groups break this:
    transfers towards higher ranks use group 0 and towards lower ranks group 1 (:func:`ir.link_group`),
    so on each rank pair a group carries one direction only, a send never queues in front of the receive
    of the opposite direction, and each group drains FIFO because the plan lists every rank pair's sends
    and receives in the same order (checked by the verifier). Paired non-blocking ops (posting an
    exchange's isend and irecv together, e.g. batch_isend_irecv) are equivalent. Beyond that the plan
    is built from one global event order (:mod:`.comms`), so it also runs with a single in-order queue
    per rank; ``verify(plan, semantics="serial")`` checks exactly that.

    Several requests run one at a time (``request_order="sequential"``, see the module docstring), so
    each pays its drain; :func:`.packing.build_vpp_packed` fills it.
    """
    return build_plan(layout, requests, min_slack=1, comm="async", name=name, request_order=request_order,
                      concurrency=concurrency, steps=steps)


__all__ = ["REQUEST_ORDERS", "build_cpp", "build_plan", "build_vpp", "build_vpp_async", "plan_from_orders"]
