"""Running plans on real ranks: the pipeline object of an inference loop (prefill, decode, generate),
the executor (the IR's interpreter on process groups), the start-up handshake, bounded waits (the
watchdog), sampling, the public prefill calls and the runtime side of DCPP and of the GPipe reference.

This is a model author's one import for running: the prefill calls (``forward_vpp_prefill``,
``forward_cpp_prefill``, ``forward_dcpp_prefill``, ``forward_prefill``), ``Pipeline`` for an inference
loop, and :func:`vpp.schedules.make_layout` (re-exported: the layout the calls run on).

It knows the stage contract (:class:`.stage_contract.StageModule`, every member it reads) but imports no
model code; :mod:`.layer_stages` cuts a model author's own layers into stages that follow it.
"""

from vpp.schedules import Layout, make_layout

from .api import (PrefillOutput, forward_cpp_prefill, forward_prefill, forward_vpp_prefill,
                  gather_trace, infer_layout)
from .dcpp_profile import forward_dcpp_prefill, profile_planner
from .executor import ExecutionResult, Executor
from .pipeline import Generation, Pipeline
from .sampling import Sampler
from .watchdog import ExecutionError

__all__ = ["ExecutionError", "Layout", "make_layout", "ExecutionResult", "Executor", "Generation", "Pipeline", "PrefillOutput", "Sampler",
           "forward_cpp_prefill", "forward_dcpp_prefill", "forward_prefill", "forward_vpp_prefill",
           "gather_trace", "infer_layout", "profile_planner"]
