"""The public schedule API in one import: everything of :mod:`vpp.plan` (layouts, IR, builders,
strategies, verifier, simulator, traces) and the prefill calls of :mod:`vpp.runtime`
(``forward_vpp_prefill``, ``forward_cpp_prefill``, ``forward_prefill``, ``forward_dcpp_prefill``).

The inference-loop objects that use these schedules (``Pipeline``, ``Sampler``, ``Generation``) are
:mod:`vpp.runtime`'s. This module only re-exports, for users; library code imports the room that
defines a name.
"""

from vpp.plan import (
    Action, COMM_MODES, COMPUTE, Cost, DcppPlanner, FlopCost, HANDOFF, KINDS, Layout, LinearCost, Plan,
    PlanError, RECV, REQUEST_ORDERS, Request, SEND, STRATEGIES, Span, Strategy, StreamStats, Summary,
    TableCost, Task, Trace, admission_gates, auto_slack, balance, balance_ranks, build_cpp, build_plan, build_vpp,
    build_vpp_async, build_vpp_packed, chunk_requests, dcpp_requests, drain_idle, drain_windows,
    fit_quadratic, format_summaries, insert_comms, link_group, list_schedule, live_requests,
    make_layout, nominal_starts, packed_chunks, plan_from_orders, replace_actions, request_done_times,
    request_ttft, seconds_per_token, simulate, slot_key, strategies, stream_stats, summarize, timeline,
    verify, workloads,
)
from vpp.runtime import (
    ExecutionError, ExecutionResult, Executor, PrefillOutput, build_schedule, forward_cpp_prefill,
    forward_dcpp_prefill, forward_prefill, forward_vpp_prefill, gather_trace, infer_layout,
    profile_planner,
)

__all__ = [
    "Action", "COMM_MODES", "COMPUTE", "Cost", "DcppPlanner", "ExecutionError", "ExecutionResult",
    "Executor", "FlopCost", "HANDOFF", "KINDS", "Layout", "LinearCost", "Plan", "PlanError",
    "PrefillOutput", "RECV", "REQUEST_ORDERS", "Request", "SEND", "STRATEGIES", "Span", "Strategy",
    "StreamStats", "Summary", "TableCost", "Task", "Trace", "admission_gates", "auto_slack", "balance", "balance_ranks",
    "build_cpp", "build_plan", "build_schedule", "build_vpp", "build_vpp_async", "build_vpp_packed",
    "chunk_requests", "dcpp_requests", "drain_idle", "drain_windows", "fit_quadratic",
    "format_summaries", "forward_cpp_prefill", "forward_dcpp_prefill", "forward_prefill",
    "forward_vpp_prefill", "gather_trace", "infer_layout", "insert_comms", "link_group",
    "list_schedule", "live_requests", "make_layout", "nominal_starts", "packed_chunks",
    "plan_from_orders", "profile_planner", "replace_actions", "request_done_times", "request_ttft",
    "seconds_per_token", "simulate", "slot_key", "strategies", "stream_stats", "summarize", "timeline",
    "verify", "workloads",
]
