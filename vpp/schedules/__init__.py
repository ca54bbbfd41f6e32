"""What runs when: layouts (stage -> rank), the schedule IR, plan builders, verifier, simulator,
executor and traces.

Data flows one way: :func:`make_layout` splits the model into stages and places them on ranks; a
builder (:func:`build_cpp`, :func:`build_vpp`, :func:`build_vpp_async`) emits a :class:`Plan` of
per-rank :class:`Action` lists; :func:`verify` checks it; :func:`simulate` (or the executor) interprets
it and returns a :class:`Trace`; :func:`summarize` gives the paper's Table 2 numbers.

Nothing here imports torch or a process group; matplotlib is imported only by ``Trace.plot``.
"""

from .builders import build_cpp, build_plan, build_vpp, build_vpp_async, plan_from_orders
from .comms import insert_comms
from .cost import Cost, FlopCost, LinearCost, TableCost, seconds_per_token
from .ir import (COMM_MODES, COMPUTE, HANDOFF, RECV, SEND, Action, Plan, Request, chunk_requests,
                 link_group, replace_actions)
from .layout import KINDS, Layout, balance, make_layout
from .order import Task, auto_slack, list_schedule, nominal_starts, orders_from_key, slot_key
from .simulator import simulate
from .summary import Summary, format_summaries, summarize, timeline
from .trace import Span, Trace
from .verify import PlanError, verify

__all__ = [
    "Action", "COMM_MODES", "COMPUTE", "Cost", "FlopCost", "HANDOFF", "KINDS", "Layout", "LinearCost",
    "Plan", "PlanError", "RECV", "Request", "SEND", "Span", "Summary", "TableCost", "Task", "Trace",
    "auto_slack", "balance", "build_cpp", "build_plan", "build_vpp", "build_vpp_async", "chunk_requests",
    "format_summaries", "insert_comms", "link_group", "list_schedule", "make_layout", "nominal_starts",
    "orders_from_key", "plan_from_orders", "replace_actions", "seconds_per_token", "simulate", "slot_key",
    "summarize", "timeline", "verify",
]
