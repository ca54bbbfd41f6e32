"""Joining the ranks into one process group: the launcher's environment (torchrun's ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``: :func:`init_distributed` is the one place
that reads them), the start-up rendezvous every rank passes before the group is built, a start-up
failure told to the peers still waiting there (:func:`announce_start_failure`), and the check that
ranks started on several nodes were given the same arguments (:func:`check_same_on_every_rank`).
Starting the processes themselves is :mod:`vpp.parallel.spawn`'s job."""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist

from vpp.parallel.device import Accelerator, get_accelerator


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def init_distributed(
    accelerator: Accelerator | None = None,
    *,
    init_method: str = "env://",
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    timeout_s: float = 600.0,
    startup_timeout_s: float = 300.0,
) -> tuple[Accelerator, int]:
    """Initialise ``torch.distributed`` for this process; returns the accelerator and local rank.

    ``timeout_s`` bounds every collective of the process group. Start-up is bounded apart, by
    ``startup_timeout_s``: every rank first waits for all the others at the rendezvous store, and only
    then is the group built (gloo, NCCL and HCCL fix a group's timeout when it is built, so a peer whose
    interpreter starts slowly on a loaded machine would otherwise fail a short ``timeout_s``).

    Under torchrun, ``rank``/``world_size`` come from the environment. Already-initialised processes
    are left alone. The local rank picks the card on multi-device nodes (``local_rank`` when given,
    else ``LOCAL_RANK``, else ``rank``).
    """
    acc = accelerator or get_accelerator()
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", rank if rank is not None else 0))
    if acc.kind != "cpu" and local_rank >= acc.device_count:
        raise RuntimeError(f"local rank {local_rank} needs {acc.kind} device {local_rank}, but only "
                           f"{acc.device_count} {acc.kind} devices are visible: start at most "
                           f"{acc.device_count} ranks per node (one device per rank)")
    if acc.kind == "cuda":
        torch.cuda.set_device(local_rank)
    elif acc.kind == "npu":
        torch.npu.set_device(local_rank)  # type: ignore[attr-defined]
    if not dist.is_initialized():
        store, rank, world_size = _rendezvous(init_method, rank, world_size, startup_timeout_s)
        dist.init_process_group(acc.backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return acc, local_rank


def _rendezvous(init_method: str, rank: int | None, world_size: int | None,
                timeout_s: float) -> tuple[dist.Store, int, int]:
    """The rendezvous store of ``init_method`` (env:// reads torchrun's variables), once every rank has
    reached it (waiting up to ``timeout_s``)."""
    store, rank, world_size = next(dist.rendezvous(
        init_method, rank=-1 if rank is None else rank, world_size=-1 if world_size is None else world_size,
        timeout=datetime.timedelta(seconds=timeout_s)))
    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    key = "vpp-started"
    store.add(key, 1)
    deadline = time.monotonic() + timeout_s
    while int(store.add(key, 0)) < world_size:
        if store.check([_failed_key()]):  # a peer failed before it got here (announce_start_failure)
            failed, message = store.get(_failed_key()).decode().split(" ", 1)
            exc = RuntimeError(f"global rank {failed} failed before the ranks started: {message}")
            exc.global_rank = int(failed)  # type: ignore[attr-defined]
            raise exc
        if time.monotonic() > deadline:
            raise RuntimeError(f"global rank {rank}: {int(store.add(key, 0))} of {world_size} ranks reached the "
                               f"rendezvous within {timeout_s:.0f}s")
        time.sleep(0.01)
    return store, rank, world_size


def _failed_key() -> str:
    """The store key of a start-up failure, one per attempt (torchrun's agent keeps its store across
    the restarts of ``--max-restarts``)."""
    return f"vpp-failed-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def announce_start_failure(message: str, timeout_s: float = 5.0) -> None:
    """Under torchrun, before this rank has joined the process group: tell the peers waiting at the
    start-up rendezvous (:func:`init_distributed`) that it failed, with ``message``, so they stop at
    once, naming it, instead of waiting out the start-up timeout (on other nodes torchrun does not
    stop them). Only where torchrun's agent hosts that store (``TORCHELASTIC_USE_AGENT_STORE``, its
    default), so that it is there whichever rank failed; best effort."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true" or dist.is_initialized():
        return
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        store.compare_set(_failed_key(), "", f"{int(os.environ['RANK'])} {message}")  # the first failure stays
    except Exception:  # noqa: BLE001 -- best effort: the peers still end at their start-up timeout
        pass


def check_same_on_every_rank(values: dict) -> None:
    """Raise ``ValueError`` on every rank unless every rank of the default process group holds equal
    ``values`` (one all-gather): the message names the ranks that differ from global rank 0 and, per
    differing key, their value beside rank 0's."""
    world = dist.get_world_size()
    if world == 1:
        return
    everyone: list = [None] * world
    dist.all_gather_object(everyone, values)
    ref = everyone[0]
    # compared as text: a float NaN given on every rank is the same argument, yet unequal to itself
    differ = [r for r, v in enumerate(everyone) if repr(v) != repr(ref)]
    if not differ:
        return
    other = everyone[differ[0]]
    keys = sorted(k for k in set(ref) | set(other) if repr(ref.get(k)) != repr(other.get(k)))
    what = "; ".join(f"{k} {other.get(k)!r} (global rank 0: {ref.get(k)!r})" for k in keys)
    raise ValueError(f"global rank(s) {differ} of {world} were started with other arguments than global rank 0: "
                     f"global rank {differ[0]} has {what}")


__all__ = ["announce_start_failure", "check_same_on_every_rank", "init_distributed", "launched_by_torchrun"]
