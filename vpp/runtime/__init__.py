"""Running plans on real ranks: the executor (the IR's interpreter on process groups), the start-up
handshake, bounded waits (the watchdog), the public prefill calls and the runtime side of DCPP and of
the GPipe reference.

It knows the stage contract (:mod:`vpp.models.stage` documents it) but imports no model code.
"""

from .api import (PrefillOutput, build_schedule, forward_cpp_prefill, forward_prefill, forward_vpp_prefill,
                  gather_trace, infer_layout)
from .dcpp import forward_dcpp_prefill, profile_planner
from .executor import ExecutionResult, Executor
from .watchdog import ExecutionError

__all__ = ["ExecutionError", "ExecutionResult", "Executor", "PrefillOutput", "build_schedule",
           "forward_cpp_prefill", "forward_dcpp_prefill", "forward_prefill", "forward_vpp_prefill", "gather_trace",
           "infer_layout", "profile_planner"]
