"""What runs when: layouts (stage -> rank), the schedule IR, plan builders, verifier, simulator,
executor and traces.

Data flows one way: :func:`make_layout` splits the model into stages and places them on ranks; a
builder (:func:`build_cpp`, :func:`build_vpp`, :func:`build_vpp_async`, :func:`build_vpp_packed`) emits
a :class:`Plan` of per-rank :class:`Action` lists; :func:`verify` checks it; :func:`simulate` (or the
executor) interprets it and returns a :class:`Trace`; :func:`summarize` gives the paper's Table 2
numbers and :func:`stream_stats` a request stream's TTFT and throughput. :mod:`.workloads` generates
the paper's short / long / mixed request streams.

Nothing here imports torch or a process group until the executor is used: ``forward_vpp_prefill``,
``forward_cpp_prefill``, ``forward_prefill`` and ``Executor`` load on first access. matplotlib is
imported only by ``Trace.plot``.
"""

from .builders import REQUEST_ORDERS, build_cpp, build_plan, build_vpp, build_vpp_async, plan_from_orders
from .comms import insert_comms
from .dcpp import DcppPlanner, dcpp_requests, fit_quadratic
from .cost import Cost, FlopCost, LinearCost, TableCost, seconds_per_token
from .ir import (COMM_MODES, COMPUTE, HANDOFF, RECV, SEND, Action, Plan, Request, chunk_requests,
                 link_group, replace_actions)
from .layout import KINDS, Layout, balance, make_layout
from .order import Task, admission_gates, auto_slack, list_schedule, nominal_starts, orders_from_key, slot_key
from .packing import build_vpp_packed, packed_chunks
from .simulator import simulate
from .stream import (StreamStats, drain_idle, drain_windows, live_requests, request_done_times, request_ttft,
                     stream_stats)
from .summary import Summary, format_summaries, summarize, timeline
from .trace import Span, Trace
from .verify import PlanError, verify

__all__ = [
    "DcppPlanner", "dcpp_requests", "fit_quadratic",
    "Action", "COMM_MODES", "COMPUTE", "Cost", "FlopCost", "HANDOFF", "KINDS", "Layout", "LinearCost",
    "Plan", "PlanError", "RECV", "REQUEST_ORDERS", "Request", "SEND", "Span", "StreamStats", "Summary",
    "TableCost", "Task", "Trace", "admission_gates", "auto_slack", "balance", "build_cpp", "build_plan",
    "build_vpp", "build_vpp_async", "build_vpp_packed", "chunk_requests", "drain_idle", "drain_windows",
    "format_summaries", "insert_comms", "link_group", "list_schedule", "live_requests", "make_layout",
    "nominal_starts", "orders_from_key", "packed_chunks", "plan_from_orders", "replace_actions",
    "request_done_times", "request_ttft", "seconds_per_token", "simulate", "slot_key", "stream_stats",
    "summarize", "timeline", "verify",
]

_LAZY = {"forward_prefill": "api", "forward_dcpp_prefill": "dcpp_runtime", "profile_planner": "dcpp_runtime", "forward_vpp_prefill": "api", "forward_cpp_prefill": "api",
         "PrefillOutput": "api", "infer_layout": "api", "gather_trace": "api",
         "Executor": "executor", "ExecutionResult": "executor", "ExecutionError": "watchdog"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
