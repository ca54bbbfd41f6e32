"""Two real ranks on one device: the process group's point-to-point path, communicator warm-up, the
timeouts and an injected dead peer, for correctness and hangs (not speed).

    python -m vpp.testing.nccl_pair --rank R --world 2 --port P --out FILE [--backend nccl|gloo] [--eager]
                                    [--timeout SECONDS]

NCCL refuses two ranks on one GPU unless each process has its own ``NCCL_HOSTID`` (then it takes them
for hosts apart and moves the data over sockets: ``NCCL_SOCKET_IFNAME=lo``, no P2P, no SHM); the caller
(``benchmarks/device_check.py`` part d) sets those per rank, and :func:`vpp.parallel.spawn.check_device_count`
accepts fewer devices than ranks for that override only. ``--backend gloo`` rehearses every step on CPU.
``--eager``: ``init_process_group(device_id=...)`` (one stream per process group: vpp batches a step's
transfers). ``--timeout``: the pipeline's ``timeout_s`` (default :data:`TIMEOUT_S`; the process group's is
ten times the default). Steps, each reported in the JSON written to ``--out`` by each rank:

1. warm-up: :class:`~vpp.runtime.pipeline.Pipeline` sets up every communicator (timed);
2. a VPP-Async prefill against an unpipelined forward of the same weights (max |diff| of the logits);
3. two requests ``1.5 timeout_s`` apart: a healthy idle gap longer than the timeout must pass;
4. rank 1 dies (``os._exit``) in the middle of a prefill: rank 0 must end within the timeout (plus the
   blame grace) with an error naming global rank 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist

TIMEOUT_S = 4.0


def _job(args) -> dict:
    from vpp.models.registry import open_model
    from vpp.parallel import ParallelGroups, initialize_model_parallel
    from vpp.runtime.pipeline import Pipeline
    from vpp.schedules import make_layout

    device = torch.device("cpu") if args.backend == "gloo" else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group(args.backend, rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=10 * TIMEOUT_S),
                            **({"device_id": device} if args.eager and device.type == "cuda" else {}))
    groups = initialize_model_parallel(1, args.world)
    model = open_model("toy")
    layout = make_layout("v", model.num_layers, args.world)
    mine = layout.stages_of(args.rank)
    start = time.perf_counter()
    pipe = Pipeline([model.build(layout.stage_layers[s], groups) for s in mine], groups, timeout_s=args.timeout)
    report = {"rank": args.rank, "backend": args.backend, "eager": args.eager, "warm_s": time.perf_counter() - start}
    prompt = torch.arange(96) % 500
    out = pipe.prefill(prompt if 0 in mine else None, 16, schedule="vpp-async", request_ids=[0])
    if out.all_logits:
        full = model.build((0, model.num_layers), ParallelGroups.single(groups.accelerator, device))
        ref = full(prompt.to(device), 0, 0, last_token_only=True)[-1]
        report["max_abs_diff"] = float((out.all_logits[0].float() - ref.float()).abs().max())
    start = time.perf_counter()
    gap = 1.5 * args.timeout
    out = pipe.prefill([prompt, prompt[:48]] if 0 in mine else None, 16, schedule="vpp-async", arrivals=[0.0, gap],
                       request_ids=[1, 2])
    report["idle_gap"] = {"gap_s": gap, "timeout_s": args.timeout, "wall_s": time.perf_counter() - start,
                          "requests": sorted(out.all_logits)}
    if args.rank == 1:  # the dead peer: gone in the middle of the next prefill, without a word
        stage = pipe.stages[0]
        real, calls = stage.forward, []

        def dies(*a, **kw):
            calls.append(1)
            if len(calls) == 3:
                with open(args.out, "w") as f:
                    json.dump(report, f)
                os._exit(0)
            return real(*a, **kw)
        stage.forward = dies
    start = time.perf_counter()
    try:
        pipe.prefill(prompt if 0 in mine else None, 16, schedule="vpp-async", request_ids=[3])
        report["fault"] = {"raised": False, "wall_s": time.perf_counter() - start}
    except Exception as exc:  # noqa: BLE001 -- what is reported is the point
        report["fault"] = {"raised": True, "wall_s": time.perf_counter() - start, "error": str(exc)[:400],
                           "named_global_rank": getattr(exc, "global_rank", None),
                           "within_s": args.timeout + 2.0}
    return report


def pair_env(rank: int, backend: str) -> dict:
    """Rank ``rank``'s environment: on NCCL its own ``NCCL_HOSTID`` and loopback sockets (two ranks, one GPU)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if backend == "nccl":
        env.update(NCCL_HOSTID=f"vpp-pair-{rank}", NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1",
                   NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0"))
    return env


def run_pair(backend: str = "nccl", *, eager: bool = False, limit_s: float = 120.0, cwd: str | None = None,
             timeout_s: float = TIMEOUT_S) -> list[dict]:
    """Start both ranks (``python -m vpp.testing.nccl_pair``) and return their reports (a rank that
    wrote none: ``{"rank": r, "error": its stderr's tail}``). Every process ends within ``limit_s``.
    ``timeout_s``: the pipeline's timeout (``--timeout``); the idle gap is 1.5 times it."""
    import socket
    import subprocess
    import sys
    import tempfile

    if backend == "nccl":  # two ranks, one GPU: vpp's device-count check accepts it for distinct host ids only
        from vpp.parallel.device import get_accelerator
        from vpp.parallel.spawn import check_device_count
        check_device_count(get_accelerator("cuda"), 2, host_ids=[pair_env(r, backend)["NCCL_HOSTID"] for r in range(2)])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for r in range(2):
            cmd = [sys.executable, "-m", "vpp.testing.nccl_pair", "--rank", str(r), "--port", str(port),
                   "--out", os.path.join(tmp, f"{r}.json"), "--backend", backend, "--timeout", repr(timeout_s),
                   *(["--eager"] if eager else [])]
            procs.append(subprocess.Popen(cmd, cwd=cwd, env=pair_env(r, backend), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        deadline, reports = time.monotonic() + limit_s, []
        for r, p in enumerate(procs):
            try:
                _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
                err = f"still running after {limit_s:g}s (killed)\n{err}"
            path = os.path.join(tmp, f"{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    reports.append(json.load(f))
            else:
                reports.append({"rank": r, "error": (err or "")[-2000:]})
        return reports


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S)
    args = ap.parse_args(argv)
    report = _job(args)
    with open(args.out, "w") as f:
        json.dump(report, f)
    os._exit(0)  # the process group may hold a dead peer's connection: do not wait for its teardown


if __name__ == "__main__":
    raise SystemExit(main())
