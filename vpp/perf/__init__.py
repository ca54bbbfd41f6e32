"""Paper-scale performance model: what a long prefill costs on a real deployment, in simulation.

* :mod:`.configs` -- DeepSeek-V3.1, GLM-5.2 and Qwen3-Coder-30B-A3B as HF config dicts; :func:`get_config`;
  Llama3-405B (dense GQA, the context-parallelism anchor) as an :class:`Arch`; :func:`get_arch`.
* :mod:`.arch` -- :class:`Arch`, the architecture as the cost model sees it (GQA / MLA / DSA, MoE).
* :mod:`.ops` -- per-layer FLOPs, bytes, kernel launches and TP collectives for a chunk at a prefix
  (:func:`layer_ops`), under a :class:`Parallel` (tp, ep, dtypes).
* :mod:`.hardware` -- :class:`Device` and presets (Ascend 910C die, H100, H200, this CPU); every constant
  carries its source; :func:`get_device`.
* :mod:`.deployment` -- :class:`DeploymentCost`, the simulator's cost protocol for a model on a device split
  by a :class:`vpp.schedules.Layout` (with the launch stall of a runner that syncs before every step).
* :mod:`.op_cache` -- a layer's (and the ends') op times on a chunk, cached once per process for equal
  (arch, device, parallelism): the same floats for every cost instance.
* :mod:`.cp` -- :class:`ContextParallelCost`: every stage on cp ring-attention ranks (pass-KV / pass-Q,
  load-balanced sharding), CP memory, the full-prefill time of Meta's anchor.
* :mod:`.decompose` -- the paper's Table 2 split (computation / bubble / exposed communication, launch
  stall, overlap ratio) in the profiler's view of waiting.
* :mod:`.runs` -- one strategy run (CPP, DCPP, VPP, VPP-Async, packing) of a :class:`.runs.Setup` (pp x cp x tp).
* :mod:`.rank_memory` -- weights, KV cache and peak activations per rank of a simulated schedule.
* :mod:`.taper`, :mod:`.deployment_search` -- the head/tail taper chunk planner and the auto-tuner (``vpp tune``).
The fits, sweeps, paper-scale streams and comparisons are the paper study's (``benchmarks/paper/``, scripts).
"""

from .arch import Arch
from .configs import LLAMA3_405B, get_arch, get_config
from .cp import ContextParallelCost
from .deployment import DeploymentCost
from .hardware import ASCEND_910C, CPU, H100, H200, Device, get_device
from .ops import Op, Parallel, layer_ops

__all__ = ["ASCEND_910C", "Arch", "CPU", "ContextParallelCost", "DeploymentCost", "Device", "H100", "H200",
           "LLAMA3_405B", "Op", "Parallel", "get_arch", "get_config", "get_device", "layer_ops"]
