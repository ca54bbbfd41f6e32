"""Communication verbs, each with an explicit :class:`~vpp.parallel.groups.Group`.

Tensor-parallel region (Megatron's vocabulary; inference only, so no autograd functions):

* :func:`copy_to_tp`   -- enter a TP region: identity (the input is replicated on every TP rank).
* :func:`reduce_from_tp` -- leave a row-parallel region: all-reduce (sum) of partial results.
* :func:`gather_from_tp` -- leave a column-parallel region: all-gather along a dim.
* :func:`scatter_to_tp`  -- keep this rank's slice along a dim (no communication).
* :func:`all_to_all`     -- expert-parallel token exchange with per-rank split sizes.

Every verb returns at once when the group has one member. Pipeline point-to-point transfers are
non-blocking only (:func:`isend`, :func:`irecv`, :func:`exchange`): a blocking send offered to
callers is how two ranks that both send first deadlock on gloo, so there is none. Peers are given
as indices along the group's axis, not global ranks.

Exchanges in both directions (:func:`exchange`, the point-to-point all-to-all) are fused into one
``dist.batch_isend_irecv`` on NCCL and HCCL: there each separate ``irecv`` blocks its stream until its
send arrives, so two ranks that each post a receive before their send to the other never start either
send. gloo posts them separately (receives first), which cannot deadlock there.

A group's first ``batch_isend_irecv`` must include every rank of the group (torch's documentation: it
sets up the communicator), but a rank may have nothing to exchange (an all-to-all with no rows to or
from anyone). So the first exchange on a group starts with a one-element all-reduce that every rank of
it makes (:func:`first_call`): every rank reaches the exchange, whatever it posts.

``all_to_all(impl="auto")`` picks its path from the group's backend, never from an error one rank
saw: the same answer on every rank (an error on one rank that sent it alone down the other path
left the ranks' transfers out of step).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from vpp.parallel.device import KINDS
from vpp.parallel.groups import Group


def copy_to_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x


def reduce_from_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Sum ``x`` over the group, in place; returns ``x``."""
    if group.size == 1:
        return x
    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group.pg)
    return x


def gather_from_tp(x: torch.Tensor, group: Group, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in rank order (all ranks get the result)."""
    if group.size == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(group.size)]
    dist.all_gather(parts, x, group=group.pg)
    return torch.cat(parts, dim=dim)


def scatter_to_tp(x: torch.Tensor, group: Group, dim: int = -1) -> torch.Tensor:
    """This rank's equal slice of ``x`` along ``dim``."""
    if group.size == 1:
        return x
    size = x.shape[dim]
    if size % group.size:
        raise ValueError(f"dim {dim} of size {size} does not split evenly over a group of {group.size}")
    return x.chunk(group.size, dim=dim)[group.rank].contiguous()


def all_to_all(
    x: torch.Tensor,
    group: Group,
    input_splits: Sequence[int],
    output_splits: Sequence[int],
    *,
    impl: str = "auto",
) -> torch.Tensor:
    """Exchange rows of ``x``: rows ``input_splits[j]`` go to rank ``j``; ``output_splits[j]`` rows
    arrive from rank ``j``, concatenated in rank order.

    ``impl``: ``"native"`` (``all_to_all_single``), ``"p2p"`` (paired non-blocking sends/receives,
    for backends that lack the collective) or ``"auto"`` (native on the backends that have it,
    :data:`NATIVE_ALL_TO_ALL_BACKENDS`, else p2p: decided by the backend, so every rank agrees; an
    error raises on every path).
    """
    if group.size == 1:
        return x
    if len(input_splits) != group.size or len(output_splits) != group.size:
        raise ValueError(
            f"all_to_all needs {group.size} split sizes, got {len(input_splits)} in / {len(output_splits)} out"
        )
    if sum(input_splits) != x.shape[0]:
        raise ValueError(f"input_splits sum to {sum(input_splits)} but x has {x.shape[0]} rows")
    out = x.new_empty((sum(output_splits), *x.shape[1:]))
    if impl not in ("auto", "native", "p2p"):
        raise ValueError(f"impl={impl!r}: choose auto, native or p2p")
    if impl == "native" or (impl == "auto" and native_all_to_all(group)):
        dist.all_to_all_single(out, x.contiguous(), list(output_splits), list(input_splits), group=group.pg)
        return out
    return _all_to_all_p2p(x, out, group, input_splits, output_splits)


FUSED_P2P_BACKENDS = ("nccl", "hccl")
NATIVE_ALL_TO_ALL_BACKENDS = ("nccl", "hccl", "gloo", "mpi")


def native_all_to_all(group: Group) -> bool:
    """True when ``group``'s backend has ``all_to_all_single`` (asked of the group: every rank agrees)."""
    if group.pg is None or not dist.is_initialized():
        return True
    return str(dist.get_backend(group.pg)).lower() in NATIVE_ALL_TO_ALL_BACKENDS


_STARTED: set[tuple[int, int]] = set()  # (id(pg), rank in it) whose first exchange was made (groups live for the run)


def first_call(group: Group, device: torch.device) -> None:
    """Before a group's first fused exchange: a one-element all-reduce that every rank of the group makes
    (the communicator's set-up includes them all, whatever each then posts). Later calls: nothing."""
    if group.pg is None or (id(group.pg), group.rank) in _STARTED:
        return
    dist.all_reduce(torch.zeros(1, device=device), group=group.pg)
    _STARTED.add((id(group.pg), group.rank))


def fuses_p2p(group: Group) -> bool:
    """True when ``group``'s backend needs both directions of an exchange fused (NCCL, HCCL)."""
    if group.pg is None or not dist.is_initialized():
        return False
    return str(dist.get_backend(group.pg)).lower() in FUSED_P2P_BACKENDS


def _post_pairs(sends, recvs, group: Group, device: torch.device | None = None) -> list:
    """Post ``recvs`` ((buffer, peer) pairs) and ``sends`` ((tensor, peer) pairs): one fused
    ``batch_isend_irecv`` on NCCL/HCCL (after :func:`first_call`, on every rank: ``device`` is where its
    one element lives when this rank has nothing to post), receives then sends one by one elsewhere.
    Returns the works."""
    for _, peer in (*sends, *recvs):
        _check_peer(peer, group)
    if fuses_p2p(group):
        tensors = [t for t, _ in (*sends, *recvs)]
        first_call(group, tensors[0].device if tensors else device if device is not None else _current_device(group))
        ops = [dist.P2POp(dist.irecv, buf, group.global_rank(peer), group.pg) for buf, peer in recvs]
        ops += [dist.P2POp(dist.isend, x.contiguous(), group.global_rank(peer), group.pg) for x, peer in sends]
        return list(dist.batch_isend_irecv(ops)) if ops else []
    works = [dist.irecv(buf, src=group.global_rank(peer), group=group.pg) for buf, peer in recvs]
    works += [dist.isend(x.contiguous(), dst=group.global_rank(peer), group=group.pg) for x, peer in sends]
    return works


def post_exchange(sends, recvs, group: Group) -> list:
    """Post ``recvs`` and ``sends`` ((tensor, peer index) pairs) without waiting; returns the works to
    ``wait()`` (a ring step that overlaps its transfer with compute: context parallelism's pass-KV)."""
    return _post_pairs(list(sends), list(recvs), group)


def _all_to_all_p2p(x, out, group: Group, input_splits, output_splits) -> torch.Tensor:
    sends = list(torch.split(x.contiguous(), list(input_splits)))
    recvs = list(torch.split(out, list(output_splits)))
    me = group.rank
    recvs[me].copy_(sends[me])
    peers = [p for p in range(group.size) if p != me]
    works = _post_pairs([(sends[p], p) for p in peers if input_splits[p]],
                        [(recvs[p], p) for p in peers if output_splits[p]], group, x.device)
    for w in works:
        w.wait()
    return out


def exchange_counts(counts: torch.Tensor, group: Group) -> torch.Tensor:
    """Each rank sends ``counts[j]`` to rank ``j``; returns what every rank sent to this one."""
    if group.size == 1:
        return counts.clone()
    ones = [1] * group.size
    return all_to_all(counts.reshape(group.size, 1), group, ones, ones).reshape(group.size)


# --- pipeline point-to-point ---------------------------------------------------------------------

def isend(x: torch.Tensor, peer: int, group: Group, tag: int = 0) -> dist.Work:
    """Post a non-blocking send of ``x`` to member ``peer`` of ``group``; ``wait()`` the handle before
    reusing ``x``."""
    _check_peer(peer, group)
    return dist.isend(x.contiguous(), dst=group.global_rank(peer), group=group.pg, tag=tag)


def irecv(buf: torch.Tensor, peer: int, group: Group, tag: int = 0) -> dist.Work:
    """Post a non-blocking receive into ``buf`` from member ``peer`` of ``group``."""
    _check_peer(peer, group)
    return dist.irecv(buf, src=group.global_rank(peer), group=group.pg, tag=tag)


def exchange(
    sends: Sequence[tuple[torch.Tensor, int]],
    recvs: Sequence[tuple[torch.Tensor, int]],
    group: Group,
) -> None:
    """Post every receive and every send (fused on NCCL/HCCL, receives first elsewhere) and wait for
    all: a paired transfer that cannot deadlock whatever the peers' order, as long as every send has
    its receive."""
    for w in _post_pairs(list(sends), list(recvs), group):
        w.wait()


def _current_device(group: Group) -> torch.device:
    kind = KINDS.get(str(dist.get_backend(group.pg)).lower(), "cpu")
    module = getattr(torch, kind, None) if kind != "cpu" else None
    return torch.device(kind, module.current_device()) if module is not None else torch.device("cpu")


def batch_p2p(items: Sequence[tuple[str, torch.Tensor, int]], group: Group) -> list:
    """Post ``items`` (("send" | "recv", tensor, peer)) as one ``batch_isend_irecv`` on ``group``
    (its transfers run together on the group's stream); returns one work per item (NCCL returns one
    work for a coalesced batch: every item then gets it). The group's first call must have been made by
    every rank (:func:`first_call`; :func:`vpp.runtime.device_order.warm_communicators` makes it): a
    batch may include only some ranks, so it cannot be the first."""
    for _, _, peer in items:
        _check_peer(peer, group)
    if group.pg is not None and (id(group.pg), group.rank) not in _STARTED:
        raise RuntimeError(f"a batch of {len(items)} transfers on a group of {group.size} before the group's first "
                           f"call by every rank: warm the communicators first (warm_communicators, as Pipeline does)")
    ops = [dist.P2POp(dist.isend if kind == "send" else dist.irecv, t.contiguous() if kind == "send" else t,
                      group.global_rank(peer), group.pg) for kind, t, peer in items]
    works = list(dist.batch_isend_irecv(ops))
    return works if len(works) == len(items) else [works[0]] * len(items)


def _check_peer(peer: int, group: Group) -> None:
    if not 0 <= peer < group.size:
        raise ValueError(f"peer {peer} outside a group of {group.size}")
    if peer == group.rank:
        raise ValueError(f"rank {peer} cannot send to or receive from itself")


__all__ = [
    "copy_to_tp", "reduce_from_tp", "gather_from_tp", "scatter_to_tp", "all_to_all", "exchange_counts",
    "isend", "irecv", "exchange", "batch_p2p", "first_call", "fuses_p2p", "native_all_to_all", "post_exchange",
]
