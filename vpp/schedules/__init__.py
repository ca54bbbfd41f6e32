"""The schedule as data: layouts (stage -> rank), the schedule IR, plan builders, the strategy table,
verifier, simulator and traces. Pure Python: nothing here imports torch or starts a process group.

Data flows one way: :func:`make_layout` splits the model into stages and places them on ranks; a
builder (:func:`build_cpp`, :func:`build_vpp`, :func:`build_vpp_async`, :func:`build_vpp_packed`, or a
:mod:`.strategies` entry by name) emits a :class:`Plan` of per-rank :class:`Action` lists; :func:`verify`
checks it; :func:`simulate_plan` (or :mod:`vpp.runtime`'s executor) interprets it and returns a
:class:`Trace`; :func:`simulate` (:mod:`.runner`) is the one runner of a strategy on a workload under a
cost (cut, plan, simulate); :func:`summarize` gives the paper's Table 2 numbers and :func:`stream_stats` a request
stream's TTFT and throughput. :mod:`.workloads` generates the paper's short / long / mixed streams.
matplotlib is imported only by ``Trace.plot``.
"""

from . import strategies, workloads
from .builders import REQUEST_ORDERS, build_cpp, build_plan, build_vpp, build_vpp_async, plan_from_orders
from .comms import insert_comms
from .cost import Cost, FlopCost, LinearCost, TableCost, seconds_per_token
from .dcpp import DcppPlanner, dcpp_requests, fit_quadratic, plan_online
from .ir import (COMM_MODES, COMPUTE, HANDOFF, RECV, SEND, Action, Plan, Request, chunk_requests,
                 link_group, merge_tail, replace_actions)
from .layout import KINDS, Layout, balance, make_layout
from .order import Task, admission_gates, auto_slack, list_schedule, nominal_starts, slot_key
from .packing import build_vpp_packed, packed_chunks
from .rank_balance import balance_ranks, rank_loads
from .runner import Simulated, simulate
from .simulator import simulate_plan
from .spans import Span
from .strategies import STRATEGIES, Strategy
from .stream import (StreamStats, drain_idle, drain_windows, live_requests, request_done_times, request_ttft,
                     stream_stats)
from .summary import Summary, format_summaries, summarize, timeline
from .trace import Trace
from .verify import PlanError, verify

__all__ = [
    "Action", "COMM_MODES", "COMPUTE", "Cost", "DcppPlanner", "FlopCost", "HANDOFF", "KINDS", "Layout",
    "LinearCost", "Plan", "PlanError", "RECV", "REQUEST_ORDERS", "Request", "SEND", "STRATEGIES", "Simulated", "Span",
    "Strategy", "StreamStats", "Summary", "TableCost", "Task", "Trace", "admission_gates", "auto_slack",
    "balance", "balance_ranks", "build_cpp", "build_plan", "build_vpp", "build_vpp_async", "build_vpp_packed", "chunk_requests",
    "dcpp_requests", "drain_idle", "drain_windows", "fit_quadratic", "format_summaries", "insert_comms",
    "link_group", "list_schedule", "live_requests", "make_layout", "merge_tail", "plan_online", "nominal_starts", "packed_chunks",
    "plan_from_orders", "rank_loads", "replace_actions", "request_done_times", "request_ttft", "seconds_per_token",
    "simulate", "simulate_plan", "slot_key", "strategies", "stream_stats", "summarize", "timeline", "verify", "workloads",
]
