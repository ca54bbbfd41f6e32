"""Joining the ranks into one process group: the launcher's environment (torchrun's ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``: :func:`init_distributed` is the one place
that reads them), the start-up rendezvous every rank passes before the group is built, a start-up
failure told to the peers still waiting there (:func:`announce_start_failure`), the first failure of
a torchrun world recorded in its store for every rank to read (:func:`announce_failure`,
:func:`first_failure`) and in torchrun's error file, so that its summary blames the rank that failed
first (:func:`record_failure`, :func:`write_error_file`), and the check that
ranks started on several nodes were given the same arguments (:func:`check_same_on_every_rank`).
Starting the processes themselves is :mod:`vpp.parallel.spawn`'s job; the heartbeats that tell a dead
rank from a slow one, :mod:`vpp.parallel.liveness`'s."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

from vpp.parallel.device import Accelerator, get_accelerator
from vpp.parallel.host_memory import keep_freed_host_memory


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
    heartbeat=None,
) -> tuple[Accelerator, int]:
    """Initialise ``torch.distributed`` for this process; returns the accelerator and local rank.

    ``timeout_s`` bounds every collective of the process group. Start-up is bounded apart, by
    ``startup_timeout_s``: every rank first waits for all the others at the rendezvous store, and only
    then is the group built (gloo, NCCL and HCCL fix a group's timeout when it is built, so a peer whose
    interpreter starts slowly on a loaded machine would otherwise fail a short ``timeout_s``).

    ``heartbeat``: a :class:`~vpp.parallel.liveness.Heartbeat` to start on its own connection to the
    rendezvous store as soon as this rank reached it (a TCP store: torchrun's or ``env://``'s), so that
    the peers notice if this rank dies from then on; its
    :attr:`~vpp.parallel.liveness.Heartbeat.phase` follows the start-up.

    A CPU rank keeps the host memory it frees for reuse (:mod:`vpp.parallel.host_memory`;
    ``VPP_HOST_MALLOC=default`` opts out).

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
    if acc.kind == "cpu":  # a CPU rank computes in host memory: keep freed blocks (vpp.parallel.host_memory)
        keep_freed_host_memory()
    elif acc.kind == "cuda":
        torch.cuda.set_device(local_rank)
    elif acc.kind == "npu":
        torch.npu.set_device(local_rank)  # type: ignore[attr-defined]
    if not dist.is_initialized():
        store, rank, world_size = _rendezvous(init_method, rank, world_size, startup_timeout_s, heartbeat)
        if heartbeat is not None:
            heartbeat.phase = "while creating the process group"
        dist.init_process_group(acc.backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        if heartbeat is not None:
            heartbeat.phase = "after the process group was created"
    return acc, local_rank


def _rendezvous(init_method: str, rank: int | None, world_size: int | None,
                timeout_s: float, heartbeat=None) -> tuple[dist.Store, int, int]:
    """The rendezvous store of ``init_method`` (env:// reads torchrun's variables), once every rank has
    reached it (waiting up to ``timeout_s``; a peer that reached it and died stops the wait: its
    heartbeat's watcher records the failure)."""
    store, rank, world_size = next(dist.rendezvous(
        init_method, rank=-1 if rank is None else rank, world_size=-1 if world_size is None else world_size,
        timeout=datetime.timedelta(seconds=timeout_s)))
    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    if heartbeat is not None and not init_method.startswith("file://") and hasattr(store, "clone"):
        heartbeat.phase = "at the start-up rendezvous"
        heartbeat.start(store.clone(), f"vpp-alive-{_attempt()}", rank, world_size)
    key = "vpp-started"
    store.add(key, 1)
    deadline = time.monotonic() + timeout_s
    while int(store.add(key, 0)) < world_size:
        failure = first_failure(store)
        if failure is not None:  # a peer failed before it got here (announce_start_failure), or died here
            failed, message = failure
            exc = RuntimeError(f"global rank {failed} failed before the ranks started: {message}")
            exc.global_rank = failed  # type: ignore[attr-defined]
            raise exc
        if time.monotonic() > deadline:
            raise RuntimeError(f"global rank {rank}: {int(store.add(key, 0))} of {world_size} ranks reached the "
                               f"rendezvous within {timeout_s:.0f}s")
        time.sleep(0.01)
    return store, rank, world_size


def _attempt() -> str:
    """torchrun's attempt number: store keys carry it (its agent keeps its store across the restarts
    of ``--max-restarts``)."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def _failed_key() -> str:
    """The store key of the world's first failure (at start-up or later), one per attempt."""
    return f"vpp-failed-{_attempt()}"


def _root_store(store: dist.Store) -> dist.Store:
    """The store under any prefixes (a process group's store is its rendezvous store under the group's
    name): the failure key lives at the root, where the start-up and every group can read it."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def announce_failure(store: dist.Store, rank: int, message: str) -> tuple[int, str]:
    """Record in ``store`` that global rank ``rank`` failed with ``message``, unless a failure is
    recorded already (the first one stays); returns the recorded one as ``(rank, message)``."""
    value = _root_store(store).compare_set(_failed_key(), "", f"{int(rank)} {message}")
    failed, text = bytes(value).decode().split(" ", 1)
    return int(failed), text


def first_failure(store: dist.Store) -> tuple[int, str] | None:
    """The world's first recorded failure, ``(global rank, message)``, or None."""
    store = _root_store(store)
    if not store.check([_failed_key()]):
        return None
    failed, message = store.get(_failed_key()).decode().split(" ", 1)
    return int(failed), message


def write_error_file(message: str, callstack: str | None = None) -> None:
    """Under torchrun, this rank's failure in the file its agent reads (``TORCHELASTIC_ERROR_FILE``, the
    format of torch's ``@record``): the agent's summary shows ``message``, and names as root cause the
    failed rank of its node with the earliest file (whole seconds; a rank without one counts from when
    the agent saw it exit), and shows its ``callstack`` (default: the exception being handled, else
    ``message``). Replaces an older file of this rank."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": message, "extraInfo": {
        "py_callstack": callstack if callstack is not None else traceback.format_exc() if sys.exc_info()[0] else message,
        "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:  # best effort: the agent then reports the exit code alone
        pass


def announce_start_failure(message: str, timeout_s: float = 5.0) -> None:
    """Under torchrun, before this rank has joined the process group: tell the peers waiting at the
    start-up rendezvous (:func:`init_distributed`) that it failed, with ``message``, so they stop at
    once, naming it, instead of waiting out the start-up timeout (on other nodes torchrun does not
    stop them). Only where torchrun's agent hosts that store (``TORCHELASTIC_USE_AGENT_STORE``, its
    default), so that it is there whichever rank failed; best effort."""
    if not _agent_hosts_store() or dist.is_initialized():
        return
    try:
        announce_failure(agent_store(timeout_s), int(os.environ["RANK"]), message)
    except Exception:  # noqa: BLE001 -- best effort: the peers still end at their start-up timeout
        pass


def _agent_hosts_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"


def agent_store(timeout_s: float = 5.0) -> dist.Store:
    """A connection to torchrun's agent store (``MASTER_ADDR``/``MASTER_PORT``)."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def failure_store() -> dist.Store | None:
    """Where this rank records a failure: its process group's store, else (before the group exists)
    torchrun's agent store where the agent hosts it, else None."""
    if dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    return agent_store() if _agent_hosts_store() else None


# torchrun's agent polls its workers every --monitor-interval (0.1 s by default); of the failed ones it
# saw, its summary names as "Root Cause" the one with the earliest error file (whole seconds; ties and
# ranks without a file go by local rank). A rank that failed because another did leaves this much later.
VICTIM_GRACE_S = 3.0
# how gloo and NCCL say that a transfer's peer went away (naming its address, not its rank)
LOST_PEER = ("by peer", "remote process", "Broken pipe")


def record_failure(exc: BaseException, heartbeat=None) -> tuple[int, str] | None:
    """Under torchrun, ``exc`` ends this rank: record the world's first failure in the store (for the
    peers' waits) and this rank's in torchrun's error file. A rank whose error names another as the
    cause (``global_rank``: the one it waited for, or whose failure notice stopped it), or that fails
    after another's failure was recorded, is a consequence: it waits :data:`VICTIM_GRACE_S` first, so
    that on its node torchrun's agent sees the root cause exit first (and stops this rank) and, if not,
    finds this rank's error file the later one. Best effort: the store may be gone with a dead node.

    A transfer that lost its peer (:data:`LOST_PEER`) names no rank: with this rank's ``heartbeat``
    (:class:`~vpp.parallel.liveness.Heartbeat`) the peer whose heartbeat stands still is found, recorded
    as the first failure and returned as ``(rank, message)``; otherwise None."""
    rank = int(os.environ.get("RANK", dist.get_rank() if dist.is_initialized() else -1))  # before the group: torchrun's
    blamed = getattr(exc, "global_rank", None)
    message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    first = died = None
    try:
        store = failure_store()
        if store is not None:
            if (blamed is None and heartbeat is not None and any(w in message for w in LOST_PEER)
                    and first_failure(store) is None):
                died = heartbeat.silent_peer()
                if died is not None:
                    blamed = died[0]
                    announce_failure(store, *died)
            first = announce_failure(store, rank if blamed is None else blamed, message)
    except Exception:  # noqa: BLE001 -- no store: this rank's error alone
        pass
    root = blamed if blamed is not None else first[0] if first is not None else rank
    if root != rank:
        time.sleep(VICTIM_GRACE_S)
        if first is not None and first[0] != rank and first[1] not in message:
            message = f"{message} (the first failure: global rank {first[0]}: {first[1]})"
    write_error_file(message)
    return died


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


__all__ = [
    "agent_store", "announce_failure", "announce_start_failure", "check_same_on_every_rank", "failure_store",
    "first_failure", "init_distributed", "launched_by_torchrun", "record_failure", "write_error_file",
]
