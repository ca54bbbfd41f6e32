"""A step of several requests' pieces run as ONE forward, as vLLM (and vLLM-Ascend) runs a scheduled
batch: the step's tokens are concatenated, every GEMM, MoE, norm and TP collective runs once on all of
them (weights read once, kernels launched once, one all-reduce per collective on the concatenated
tokens), and only attention is per request (variable-length attention, each piece over its own prefix).

For the pieces (t_i, L_i), i = 1..n, of one step on a stage, T = t_1 + ... + t_n tokens:

* every op of the stage that is not ``per_request`` (:class:`.ops.Op`) runs once on T tokens, as
  :func:`.ops.layer_ops` gives it for a chunk of T tokens (those ops do not depend on the prefix);
  the embedding on stage 0 once on T tokens; on the last stage the final norm on T tokens and the
  logits of each piece's last token (n rows, :func:`.ops.head_ops`);
* every ``per_request`` op (attention, MLA's prefix rebuild and merge, DSA's index scores, top-k and
  sparse attention) runs per piece, with the FLOPs and bytes of (t_i, L_i), but as one kernel over all
  pieces: its launches are paid once per step (the most any piece needs);
* the per-call overhead (``device.step_overhead``) and, where the runner synchronises before the step
  (known by its lead piece's shape, as :mod:`vpp.perf.runs` records it), the launch stall, once.

The plan keeps one COMPUTE per piece (:mod:`vpp.schedules.steps`); :func:`piece_times` gives the pieces times
that sum to the step's: piece i gets its own per-request work (less launches) plus a share t_i / T of
the rest. Not on real ranks: the runtime runs one stage call per piece. Context parallelism is not
modelled here (:class:`.cp.ContextParallelCost` shards a chunk's tokens over the ring).
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from typing import Sequence

from . import op_cache

Shape = tuple[int, int]


def step_parts(cost, stage: int, shapes: Sequence[Shape]) -> tuple[dict, list[dict]]:
    """Seconds per category of one batched step of ``cost`` (a :class:`.deployment.DeploymentCost`) on
    ``stage``: ``(shared, own)``, ``shared`` the work run once for the step (every op that is not
    per-request, on the step's tokens, with every launch and the per-call costs), ``own[i]`` piece i's
    per-request work without its launches."""
    shapes = [(int(t), int(p)) for t, p in shapes]
    if not shapes or any(t < 1 or p < 0 for t, p in shapes):
        raise ValueError(f"a step needs pieces of tokens >= 1 and prefix >= 0; got {shapes}")
    dev = cost.device
    shared_parts, own = _step_layers(cost.config_id, tuple(cost.layer_kinds(stage)), stage == 0,
                                     stage == cost.layout.last_stage, tuple(shapes))
    shared: dict = defaultdict(float, shared_parts)
    if dev.step_overhead:
        shared["step"] += dev.step_overhead
    if cost.syncs(shapes[0]):
        shared["launch_stall"] += dev.host_step
    return dict(shared), [dict(o) for o in own]


@lru_cache(maxsize=1 << 15)
def _step_layers(cid: int, kinds: tuple, first: bool, last: bool, shapes: tuple) -> tuple[dict, tuple]:
    """:func:`step_parts` before the per-call terms, for the (arch, device, par) of ``cid``
    (:func:`.op_cache.config_id`) and a stage of ``kinds`` (:meth:`.deployment.DeploymentCost.layer_kinds`)."""
    device = op_cache.config(cid)[1]
    total = sum(t for t, _ in shapes)
    shared: dict = defaultdict(float)
    own = [defaultdict(float) for _ in shapes]
    for layer, n in kinds:
        for k, v in op_cache.batch_shared_layer(cid, layer, total):
            shared[k] += n * v
        kernels: dict = {}
        for mine, (t, p) in zip(own, shapes):
            for category, seconds, name, launches in op_cache.batch_own_layer(cid, layer, t, p):
                mine[category] += n * seconds
                kernels[name] = max(kernels.get(name, 0), launches)
        shared["launch"] += n * sum(kernels.values()) * device.kernel_overhead
    for parts in op_cache.ends_parts(cid, total, first, last, len(shapes)):
        for k, v in parts:
            shared[k] += v
    return dict(shared), tuple(dict(o) for o in own)


def piece_times(cost, stage: int, shapes: Sequence[Shape]) -> list[float]:
    """Seconds of each piece of one batched step on ``stage``: its own per-request work plus its token
    share of the step's shared work (see the module docstring); they sum to the step's time."""
    shared, own = step_parts(cost, stage, shapes)
    total = sum(int(t) for t, _ in shapes)
    rest = sum(shared.values())
    return [sum(o.values()) + rest * int(t) / total for o, (t, _) in zip(own, shapes)]


__all__ = ["Shape", "piece_times", "step_parts"]
