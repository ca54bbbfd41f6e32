"""After a fault on NCCL/HCCL: what a completed work's error is, and tearing the communicators down.

:func:`work_error` reads the error of a work that completed (NCCL and HCCL mark a failed work
completed and keep its error); :func:`abort_groups` aborts the communicators of a rank's process groups
so that no kernel keeps waiting for a peer that will never come (torch's ``ProcessGroup.abort()``,
else ``shutdown()``, else ``dist.destroy_process_group``).
"""

from __future__ import annotations

import torch.distributed as dist


def work_error(work) -> BaseException | None:
    """The error of a work that completed (None when it succeeded): ``Work.exception()`` where torch
    offers it, else ``is_success()``; NCCL/HCCL report a failed op as completed."""
    probe = getattr(work, "exception", None)
    if probe is not None:
        try:
            return probe()
        except Exception as exc:  # noqa: BLE001 -- a work that raises when asked failed
            return exc
    success = getattr(work, "is_success", None)
    if success is not None and not success():
        return RuntimeError("the work reports no success")
    return None


def abort_groups(pgs) -> list[str]:
    """Abort the communicators of the process groups ``pgs`` after a fault, so that no kernel keeps
    waiting for a peer that will never come (``ProcessGroup.abort()``, else ``shutdown()``, else
    ``dist.destroy_process_group``). Returns what was done to each, for the message."""
    done, seen = [], set()
    for pg in pgs:
        if pg is None or id(pg) in seen:
            continue
        seen.add(id(pg))
        for name in ("abort", "shutdown"):
            fn = getattr(pg, name, None)
            if fn is not None:
                try:
                    fn()
                    done.append(name)
                    break
                except Exception:  # noqa: BLE001 -- try the next way down
                    continue
        else:
            try:
                dist.destroy_process_group(pg)
                done.append("destroy")
            except Exception:  # noqa: BLE001 -- nothing more to do: the process group's own timeout remains
                done.append("none")
    return done


__all__ = ["abort_groups", "work_error"]
