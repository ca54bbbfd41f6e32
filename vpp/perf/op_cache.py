"""Per-category op times of a layer and of the model's ends on a chunk, cached across cost instances.

A study builds one :class:`.deployment.DeploymentCost` per run (the paper study builds over a thousand,
on a handful of (arch, device, parallelism) triples and the same chunk shapes), and a layer's times on a
chunk depend only on frozen values: the :class:`.arch.Arch`, the :class:`.hardware.Device`, the
:class:`.ops.Parallel`, the layer (its kind), the chunk's tokens and its prefix. So they are computed
once per process here, not once per instance.

Every cached figure is the float that computing it afresh gives: the same ops, timed by the same
:meth:`.hardware.Device.op_time`, added in the same order (a sum's order changes its last bit, so the
callers add cached parts exactly as the uncached code added the ops). The cached dicts and tuples are
shared: callers copy before they change one.

Keys hash a small int per (arch, device, par) seen (:func:`config_id`) rather than three dataclasses of
twenty fields each; the caches are bounded (least recently used out).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from functools import lru_cache

from .arch import Arch
from .hardware import Device
from .ops import Parallel, embed_ops, head_ops, layer_ops

_IDS: dict = {}        # (arch, device, par) -> its id
_CONFIGS: list = []    # id -> (arch, device, par)
_LOCK = threading.Lock()


def ops_breakdown(device: Device, ops) -> dict:
    """Seconds per category of ``ops`` on ``device``, kernel launches apart (``launch``)."""
    out: dict = defaultdict(float)
    for op in ops:
        t = device.op_time(op)
        if op.kind in ("allreduce", "allgather"):
            out[op.category] += t
        else:
            launch = op.kernels * device.kernel_overhead
            out[op.category] += t - launch
            out["launch"] += launch
    return out


def config_id(arch: Arch, device: Device, par: Parallel) -> int:
    """The id of (arch, device, par) in the caches below (equal triples share one)."""
    key = (arch, device, par)
    cid = _IDS.get(key)
    if cid is None:
        with _LOCK:  # two threads meeting new triples must not hand out one index twice
            cid = _IDS.get(key)
            if cid is None:
                _CONFIGS.append(key)
                cid = _IDS[key] = len(_CONFIGS) - 1
    return cid


def config(cid: int) -> tuple[Arch, Device, Parallel]:
    """The (arch, device, par) of an id from :func:`config_id`."""
    return _CONFIGS[cid]


@lru_cache(maxsize=1 << 16)
def layer_parts(cid: int, layer: int, tokens: int, prefix: int) -> dict:
    """:func:`ops_breakdown` of layer ``layer``'s ops (:func:`.ops.layer_ops`) on a chunk."""
    arch, device, par = _CONFIGS[cid]
    return dict(ops_breakdown(device, layer_ops(arch, layer, tokens, prefix, par)))


@lru_cache(maxsize=1 << 14)
def ends_parts(cid: int, tokens: int, first: bool, last: bool, requests: int = 1) -> tuple:
    """The embedding's (``first``) and then the head's (``last``; the logits of ``requests`` last tokens)
    :func:`ops_breakdown` items on ``tokens``, one tuple of items each."""
    arch, device, par = _CONFIGS[cid]
    out = (tuple(ops_breakdown(device, embed_ops(arch, tokens, par)).items()),) if first else ()
    if last:
        out += (tuple(ops_breakdown(device, head_ops(arch, tokens, par, requests=requests)).items()),)
    return out


@lru_cache(maxsize=1 << 15)
def batch_shared_layer(cid: int, layer: int, tokens: int) -> tuple:
    """The :func:`ops_breakdown` items of a layer's ops that are not per-request, on ``tokens``."""
    arch, device, par = _CONFIGS[cid]
    shared = (op for op in layer_ops(arch, layer, tokens, 0, par) if not op.per_request)
    return tuple(ops_breakdown(device, shared).items())


@lru_cache(maxsize=1 << 16)
def batch_own_layer(cid: int, layer: int, tokens: int, prefix: int) -> tuple:
    """A layer's per-request ops on one piece: (category, seconds less launches, name, kernels) each."""
    arch, device, par = _CONFIGS[cid]
    return tuple((op.category, device.op_time(op) - op.kernels * device.kernel_overhead, op.name, op.kernels)
                 for op in layer_ops(arch, layer, tokens, prefix, par) if op.per_request)


__all__ = ["batch_own_layer", "batch_shared_layer", "config", "config_id", "ends_parts", "layer_parts",
           "ops_breakdown"]
