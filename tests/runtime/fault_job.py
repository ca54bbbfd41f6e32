"""A two-rank toy prefill with a planted fault on rank 1, run by tests/runtime/test_faults.py under
torchrun or spawned. ``python fault_job.py MODE TIMEOUT OUT_DIR``; MODE: none, raise, exit, hang
(mid-prefill), hang-start (before the start-up exchange), die-groups (SIGKILL before the model-parallel
groups are created: the peer blocks creating them), die-loading (SIGKILL after building its stages,
as if loading a checkpoint: the peer waits at the start-up exchange) or die-collective (SIGKILL while the
peer waits in a collective of the caller's own: its transfer breaks, naming no rank). Each rank writes what it saw to
OUT_DIR/rank<N> (seconds from its start of the prefill, then its message) and, when it starts running,
OUT_DIR/running<N> (the wall-clock time, so the test can time the bounds from running ranks rather
than from interpreter start-up). No fault handling of its own: what it shows is the library's, with one
change of figures: under torchrun its ranks beat the library's heartbeat (:mod:`vpp.parallel.liveness`)
with the shorter periods of :data:`HEARTBEAT`, so that a planted death is noticed in seconds rather than
tens of seconds (the code path is the same)."""

from __future__ import annotations

import functools
import os
import signal
import sys
import time

import torch

from vpp.models.toy import ToyStage
from vpp.parallel import initialize_model_parallel, launch, spawn
from vpp.parallel.liveness import Heartbeat
from vpp.parallel.rendezvous import VICTIM_GRACE_S
from vpp.schedules import make_layout
from vpp.runtime import forward_prefill


# The library's: a beat a second, dead after 10 s of silence, ended 10 s after a failure if still running.
# Here 6 beats of silence, still long against a heartbeat thread held up on a loaded machine (it needs
# the GIL for microseconds a beat); a lost transfer's peer is judged after 3 beats (1.5 s). The grace
# must outlast a rank that stops by itself because of another's failure: it waits VICTIM_GRACE_S
# (record_failure) before it exits, and would otherwise be ended as blocked.
HEARTBEAT = dict(beat_s=0.5, silent_s=3.0, exit_grace_s=VICTIM_GRACE_S + 3.0)


class Faulty(ToyStage):
    def __init__(self, *a, fault=None, **kw):
        super().__init__(*a, **kw)
        self.fault = fault

    def forward(self, x, request, offset, **kw):
        if self.fault and offset >= 16:
            kind, self.fault = self.fault, None
            if kind == "raise":
                raise RuntimeError("planted fault")
            if kind == "exit":
                os._exit(3)
            if kind == "hang":
                time.sleep(600)
        return super().forward(x, request, offset, **kw)


def job(rank, world, mode, timeout_s, out_dir):
    with open(os.path.join(out_dir, f"running{rank}"), "w") as f:
        f.write(repr(time.time()))
    with open(os.path.join(out_dir, f"pid{rank}"), "w") as f:  # a forked rank's command line is its server's
        f.write(str(os.getpid()))
    if mode == "die-groups" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    groups = initialize_model_parallel(1, world)
    layout = make_layout("v", 4, world)
    fault = mode if rank == 1 and mode in ("raise", "exit", "hang") else None
    stages = [Faulty(layout.stage_layers[s], 4, vocab_size=64, fault=fault) for s in layout.stages_of(rank)]
    if mode == "die-loading" and rank == 1:
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "die-collective":
        waiting = os.path.join(out_dir, "collective0")
        if rank == 1:  # dies once rank 0 is (about to be) in the collective
            while not os.path.exists(waiting):
                time.sleep(0.05)
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        open(waiting, "w").close()
        torch.distributed.all_gather_object([None] * world, rank)
    if mode == "hang-start" and rank == 1:
        time.sleep(600)
    ids = torch.randint(0, 64, (64,), generator=torch.Generator().manual_seed(0))
    start = time.monotonic()
    try:
        forward_prefill(stages, ids if rank == 0 else None, 8, groups, schedule="vpp", timeout_s=timeout_s)
        message = "finished"
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc} |global_rank={getattr(exc, 'global_rank', None)}"
        raise
    finally:
        with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
            f.write(f"{time.monotonic() - start:.2f}\n{message}")
    return message


if __name__ == "__main__":
    mode, timeout_s, out_dir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    spawn.Heartbeat = functools.partial(Heartbeat, **HEARTBEAT)  # what launch() builds under torchrun
    launch(job, 2, mode, timeout_s, out_dir, timeout=3 * timeout_s, pg_timeout_s=timeout_s)
