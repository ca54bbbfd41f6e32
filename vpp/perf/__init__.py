"""Paper-scale performance model: what a long prefill costs on a real deployment, in simulation.

* :mod:`.configs` -- DeepSeek-V3.1, GLM-5.2 and Qwen3-Coder-30B-A3B as HF config dicts; :func:`get_config`.
* :mod:`.arch` -- :class:`Arch`, the architecture as the cost model sees it (GQA / MLA / DSA, MoE).
* :mod:`.ops` -- per-layer FLOPs, bytes, kernel launches and TP collectives for a chunk at a prefix
  (:func:`layer_ops`), under a :class:`Parallel` (tp, ep, dtypes).
* :mod:`.device` -- :class:`Device` and presets (Ascend 910C die, H100, H200, this CPU); every constant
  carries its source; :func:`get_device`.
* :mod:`.cost` -- :class:`DeploymentCost`, the simulator's cost protocol for a model on a device split by
  a :class:`vpp.schedules.Layout`.
* :mod:`.decompose` -- the paper's Table 2 split (computation / bubble / exposed communication).
* :mod:`.fit` -- the two efficiencies fitted on the paper's CPP row only.
* :mod:`.runs`, :mod:`.sweep` -- one strategy run (CPP, DCPP, VPP, VPP-Async) and sweeps.
* :mod:`.memory` -- weights, KV cache and peak activations per rank of a simulated schedule.
* :mod:`.taper`, :mod:`.tune` -- the head/tail taper chunk planner and the auto-tuner (``vpp tune``).
* :mod:`.calibrate` -- timing this CPU and a tiny model to fill the "cpu" preset (``vpp calibrate``).
"""

from .arch import Arch
from .configs import get_config
from .deployment import DeploymentCost
from .hardware import ASCEND_910C, CPU, H100, H200, Device, get_device
from .ops import Op, Parallel, layer_ops

__all__ = ["ASCEND_910C", "Arch", "CPU", "DeploymentCost", "Device", "H100", "H200", "Op", "Parallel",
           "get_config", "get_device", "layer_ops"]
