"""One script for an accelerator machine: what vpp does on a GPU or NPU, checked and timed in one go.

    PYTHONPATH=. python3 benchmarks/device_check.py [--device auto|cuda|npu] [--preset h100|h200|910c] [--out DIR]
    PYTHONPATH=. python3 benchmarks/device_check.py --dry-run      # CPU, tiny sizes: the same code paths, no claims

Needs only torch, numpy, safetensors and transformers (the tests' reference models), nothing
installed from this checkout: ``PYTHONPATH=.`` finds vpp and ``tests.models.hf_tiny``. Each part runs
in its own subprocess with its own time limit (:data:`LIMITS`, 7.5 minutes in all), so an error, a
crash or a hang in one part is reported and the others still run; one after another on the device
(each has it to itself), all at once in a dry run (nothing there is a claim). Writes ``device_check.md`` and
``device_check.json`` into ``--out`` (a directory; a path ending in .md names the markdown file).

(a) One device: a bf16 chunked prefill of each tiny family (qwen3_moe, deepseek_v3, deepseek_v32,
    glm_moe_dsa; random weights, transformers' own models saved and loaded by vpp) against transformers
    on the same device, once with the default attention workspace and once with a budget small enough
    to split MLA's prefix and DSA's queries into blocks. Passes when vpp's error against transformers
    in fp32 on the CPU is at most twice transformers' own bf16 error on the device (plus 1e-2 of the
    logit scale). Names the kernels that ran (attention, attention pieces, expert GEMM).
(b) tau_k of one full-width DeepSeek-V3 MoE layer (MLA + 256-expert MoE at the real dimensions, random
    weights, bf16, one device) over 4K chunks up to 128K tokens, timed with device events; the linear
    per-layer law tau_k = a + b k fitted to it, beside the same law from the cost model's preset for
    this device (vpp.perf.hardware: H100, H200, 910C).
(c) The executor's device path on this device: two pipeline ranks as two threads of one process, each
    on its own stream, transfers as device copies on a stream per direction (``vpp/testing/loopback.py``:
    NCCL refuses two ranks on one GPU); CPP and VPP-Async on tiny-deepseek in bf16. Measured on the
    device: host waits on a transfer and on a compute per chunk, the receive overlap from device events,
    the logits against an unpipelined forward of the same weights. With two or more devices also
    ``torchrun --nproc-per-node 2 -m vpp prefill ... --check`` on NCCL/HCCL (CPP, VPP, VPP-Async against
    an unpipelined forward), as before.
Every part reports the allocator's peak allocated and reserved memory.

(d) Optional (``--parts a,b,c,d``): two real NCCL ranks on this one GPU, each process with its own
    ``NCCL_HOSTID`` over loopback sockets (``python -m vpp.testing.nccl_pair``), with lazy and with eager
    (``device_id=``) initialisation: the ProcessGroupNCCL point-to-point path, the communicators' warm-up,
    a healthy idle gap longer than the timeout, and a rank that dies mid-prefill (the other must end
    within the timeout naming it). Correctness and hangs, not speed. In a dry run: the same on gloo.
(a) checks that this transformers has every family's config class and the keywords the tiny configs
    use; a family it lacks is skipped with a line saying why (transformers 5.17, the lent image's, has
    all four).

What a one-device run does NOT exercise: NCCL/HCCL themselves (their kernels, lazy communicator set-up
and the warm-up of it, batch_isend_irecv, the process group's timeout), the WorkWatch thread against a
real failing peer, two devices contending for a link. Those need part (c)'s torchrun run (2+ devices).

Prints markdown, and writes it with the JSON (default folder ``benchmarks/results`` on an accelerator;
nothing by default in a dry run). Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from benchmarks._device_check_report import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMITS = {"a": 110, "b": 190, "c": 150, "d": 150}  # seconds per part (a-c: 7.5 minutes in all)
DEFAULT_PARTS = "a,b,c"

FAMILIES = ("qwen3_moe", "deepseek_v3", "deepseek_v32", "glm_moe_dsa")
FULL = dict(chunk=4096, tokens=131072)
DRY = dict(chunk=64, tokens=512)


def pick_device(kind: str, dry: bool):
    from vpp.parallel.device import get_accelerator
    if dry:
        return get_accelerator("cpu")
    acc = get_accelerator(None if kind == "auto" else kind)
    if acc.kind == "cpu":
        raise SystemExit("device_check: no CUDA or NPU device here; use --dry-run for the CPU rehearsal")
    return acc


def preset_for(acc, device) -> str:
    if acc.kind == "cpu":
        return "cpu"
    name = acc.module().get_device_name(device).lower()
    if acc.kind == "npu":
        return "910c"
    return "h200" if "h200" in name else "h100"


def kernels(device_type: str, dtype=torch.bfloat16) -> str:
    from vpp.transformer.attention.kernel import kernel_for, lse_kernel_for
    from vpp.transformer.expert_gemm import expert_gemm_for
    return (f"attention `{kernel_for(device_type).__name__}`, attention pieces "
            f"`{lse_kernel_for(device_type).__name__}`, experts `{expert_gemm_for(torch.device(device_type), dtype)}`")


# --- (a) ---------------------------------------------------------------------------------------------

def _rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per position: max |a - b| over the vocabulary / max |b| (the logit scale)."""
    return (a.float() - b.float()).abs().amax(-1) / b.float().abs().amax(-1)


def check_families(acc, device, chunk: int = 16) -> list[dict]:
    from tests.models.hf_tiny import PROMPTS, VOCAB, model as hf_model
    from vpp.models import load_stage
    from vpp.parallel import ParallelGroups
    from vpp.transformer.attention.workspace import set_workspace_bytes
    rows, groups = [], ParallelGroups.single(acc, device)
    ids = torch.randint(0, VOCAB, (PROMPTS["a"],), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            missing = family_missing(family)
            if missing is not None:
                rows.append({"family": family, "skipped": missing, "ok": True})
                continue
            m = hf_model(family)
            m.save_pretrained(os.path.join(tmp, family))
            with torch.no_grad():
                ref = m(ids[None]).logits[0]
                m = m.to(device=device, dtype=torch.bfloat16)
                hf_bf16 = m(ids.to(device)[None]).logits[0].float().cpu()
            del m
            stage = load_stage(os.path.join(tmp, family), (0, 4), groups, dtype=torch.bfloat16, device=device)
            hf_err = _rel(hf_bf16, ref)
            hf_agree = float((hf_bf16.argmax(-1) == ref.argmax(-1)).float().mean())
            for budget in (None, 4 << 10):
                set_workspace_bytes(stage, budget)
                out = torch.cat([stage(ids[s:s + chunk].to(device), "a", s) for s in range(0, len(ids), chunk)])
                stage.release("a")
                out = out.float().cpu()
                err = _rel(out, ref)
                agree = float((out.argmax(-1) == ref.argmax(-1)).float().mean())
                # random tiny models amplify bf16 rounding chaotically (a flipped expert or top-k key moves
                # a position's logits by O(1)), so the typical position decides, not the worst one
                rows.append({"family": family, "workspace": "default" if budget is None else f"{budget} B",
                             "vpp_err": float(err.median()), "vpp_max": float(err.max()),
                             "hf_bf16_err": float(hf_err.median()), "hf_max": float(hf_err.max()),
                             "argmax_agree": agree, "hf_agree": hf_agree,
                             "ok": bool(err.median() <= 2 * hf_err.median() + 1e-2 and agree >= hf_agree - 0.1)})
    return rows


def family_missing(family: str) -> str | None:
    """Why this transformers cannot build ``family``'s tiny reference (its config class or a keyword the
    tiny config passes is missing), or None."""
    import transformers
    from tests.models.hf_tiny import config
    try:
        config(family)
    except (AttributeError, TypeError, ValueError) as exc:
        return f"transformers {transformers.__version__} cannot build the {family} config ({type(exc).__name__}: {exc})"
    return None


def nccl_pair(acc, dry: bool) -> dict:
    """Part (d): two NCCL ranks on one GPU (gloo in a dry run), see the module docstring."""
    from vpp.testing.nccl_pair import run_pair
    backend = "gloo" if dry else "nccl"
    runs = {}
    for eager in ((False,) if dry else (False, True)):
        reports = run_pair(backend, eager=eager, limit_s=LIMITS["d"] / 2 - 5, cwd=ROOT)
        first = reports[0]
        fault = first.get("fault", {})
        runs["eager" if eager else "lazy"] = {
            "reports": reports, "backend": backend,
            "ok": "error" not in first and first.get("max_abs_diff", 1.0) < 1e-2
                  and first.get("idle_gap", {}).get("requests") == [1, 2]
                  and fault.get("raised") is True and fault.get("named_global_rank") == 1
                  and fault.get("wall_s", 1e9) <= fault.get("within_s", 0)}
    return runs


# --- (b) ---------------------------------------------------------------------------------------------

def _fit(values) -> tuple[float, float, float]:
    """tau_k = a + b k by least squares; returns (a, b, R^2)."""
    k = np.arange(len(values), dtype=float)
    y = np.asarray(values, dtype=float)
    b, a = np.polyfit(k, y, 1)
    resid = y - (a + b * k)
    r2 = 1.0 - float(resid @ resid) / max(float(((y - y.mean()) ** 2).sum()), 1e-30)
    return float(a), float(b), r2


def layer_law(acc, device, preset: str, dry: bool) -> dict:
    from vpp.models import build_stage, model_config
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.parallel import ParallelGroups
    from vpp.perf.arch import Arch
    from vpp.perf.configs import get_config
    from vpp.perf.hardware import get_device
    from vpp.perf.ops import Parallel, layer_ops
    sizes = DRY if dry else FULL
    base = dict(TINY_CONFIGS["tiny-deepseek"]) if dry else get_config("deepseek-v3.1")
    layer = int(base.get("first_k_dense_replace", 0))  # the first MoE layer
    cfg = model_config(dict(base, num_hidden_layers=layer + 2, max_position_embeddings=max(
        sizes["tokens"], base.get("max_position_embeddings", 0))))
    stage = build_stage(cfg, (layer, layer + 1), ParallelGroups.single(acc, device), dtype=torch.bfloat16, device=device)
    with torch.no_grad():
        g = torch.Generator(device=device).manual_seed(0)
        for name, p in stage.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5, generator=g)
            else:
                p.fill_(0.0 if "bias" in name else 1.0)
    chunk, n = sizes["chunk"], sizes["tokens"] // sizes["chunk"]
    x = torch.randn(chunk, cfg["hidden_size"], generator=g, device=device, dtype=torch.bfloat16)
    stage(x, "warm-up", 0)
    stage.release("warm-up")
    stage.reserve("t", n * chunk)
    measured = []
    for k in range(n):  # a benchmark: synchronising per chunk is what timing one chunk takes
        acc.synchronize(device)
        t0 = time.perf_counter()
        stage(x, "t", k * chunk)
        acc.synchronize(device)
        measured.append(time.perf_counter() - t0)
    del stage
    arch, dev = Arch.from_config(cfg), get_device(preset)
    par = Parallel(tp=1, ep=1, act_bytes=2, weight_bytes=2, kv_bytes=2)
    predicted = [sum(dev.op_time(op) for op in layer_ops(arch, layer, chunk, k * chunk, par)) for k in range(n)]
    return {"model": "tiny-deepseek layer" if dry else "DeepSeek-V3.1 layer", "layer": layer, "chunk": chunk,
            "tokens": n * chunk, "preset": dev.name, "measured_s": measured, "predicted_s": predicted,
            "fit_measured": _fit(measured), "fit_predicted": _fit(predicted)}


# --- (c) ---------------------------------------------------------------------------------------------

def one_device_pipeline(acc, device, dry: bool) -> list[dict]:
    """CPP and VPP-Async through the executor's device path on one device (see ``_loopback``)."""
    import threading

    from vpp.testing.loopback import Hub, HostStreams, LoopbackOps, TimedStage, overlap, pipeline_groups
    from vpp.models import build_stage, model_config, random_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    from vpp.parallel import ParallelGroups
    from vpp.schedules import strategies
    from vpp.schedules.ir import chunk_requests
    from vpp.schedules.layout import make_layout
    from vpp.runtime.device_order import RUN_AHEAD_COMPUTES
    from vpp.runtime.executor import Executor
    from vpp.runtime.handshake import RankInfo, describe_stage

    dtype = torch.float32 if dry else torch.bfloat16
    config = model_config(TINY_CONFIGS["tiny-deepseek"])
    weights = random_checkpoint(config, seed=0)
    tokens, chunk = (256, 64) if dry else (16384, 1024)
    ids = torch.randint(0, config["vocab_size"], (tokens,), generator=torch.Generator().manual_seed(0))
    module = HostStreams() if acc.kind == "cpu" else acc.module()
    layers = config["num_hidden_layers"]
    with torch.inference_mode():  # the reference: every layer in one stage, chunk by chunk
        whole = build_stage(config, (0, layers), ParallelGroups.single(acc, device), dtype=dtype, device=device,
                            weights=weights)
        for s in range(0, tokens, chunk):
            last = s + chunk >= tokens
            out = whole(ids[s:s + chunk].to(device), "ref", s, last_token_only=True) if last else \
                whole(ids[s:s + chunk].to(device), "ref", s)
        ref = out[-1].float().cpu()
        del whole
    rows = []
    for schedule in ("cpp", "vpp-async"):
        strategy = strategies.get(schedule)
        layout = make_layout(strategy.layout, layers, 2)
        plan = strategy.plan(layout, chunk_requests([tokens], chunk))
        groups = [pipeline_groups(2, r, acc, device) for r in range(2)]
        built = [{s: build_stage(config, layout.stage_layers[s], groups[r], dtype=dtype, device=device, weights=weights)
                  for s in layout.stages_of(r)} for r in range(2)]
        for attempt in ("warm-up", "measured"):
            hub = Hub(module, device)
            stages = [{s: TimedStage(m, hub, r, s) for s, m in built[r].items()} for r in range(2)]
            infos = [RankInfo(r, r, 0, tuple(describe_stage(m) for m in built[r].values()), None, None, None, "loop")
                     for r in range(2)]
            ops = [LoopbackOps(hub, r, groups[r]) for r in range(2)]
            results, errors = [None, None], []
            module.synchronize()
            origin = module.Event(enable_timing=True)
            origin.record()

            def rank_main(r):
                try:
                    with module.stream(module.Stream(device)):
                        ex = Executor(plan, stages[r], groups[r], infos, run_key=f"loopback-{schedule}", timeout_s=120,
                                      timed=False, device_ops=ops[r])
                        results[r] = ex.run({0: ids} if 0 in stages[r] else None)
                except BaseException as exc:
                    errors.append(f"rank {r}: {type(exc).__name__}: {exc}")

            if acc.kind != "cpu":
                acc.module().reset_peak_memory_stats(device)
            start = time.perf_counter()
            threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(130)
            module.synchronize()
            wall = time.perf_counter() - start
            for st in built:
                for m in st.values():
                    m.release(0)
            if errors or any(t.is_alive() for t in threads):
                raise RuntimeError(f"{schedule}: " + ("; ".join(errors) or "a rank did not finish in 130 s"))
        logits = next(res.logits[0] for res in results if res.logits)
        steady, every = overlap(hub, origin, layout.last_stage)
        chunks = plan.requests[0].num_chunks
        rows.append({"schedule": schedule, "layout": layout.describe(), "tokens": tokens, "chunk": chunk,
                     "dtype": str(dtype), "run_ahead_computes": RUN_AHEAD_COMPUTES,
                     "host_blocking_waits_per_chunk": sum(hub.host_transfer_waits) / chunks,
                     "host_compute_waits_per_chunk": sum(o.host_compute_waits for o in ops) / chunks,
                     "recv_overlap": steady, "recv_overlap_all": every, "wall_s": wall,
                     "max_abs_diff": float((logits.float().cpu() - ref).abs().max()),
                     "ref_scale": float(ref.abs().max()), **peak(acc, device)})
        del built
    return rows


def two_ranks(acc, dry: bool, timeout: float) -> dict:
    if not dry and acc.device_count < 2:
        return {"skipped": f"{acc.device_count} {acc.kind} device(s): a 2-rank run needs two"}
    seq, chunk = ("256", "64") if dry else ("8192", "1024")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "vpp", "prefill",
           "--model", "tiny-deepseek", "--pp", "2", "--seq-len", seq, "--chunk-size", chunk, "--repeat", "1",
           "--check", "--json", "--no-progress", "--device", acc.kind]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    shown = " ".join(cmd[2:])
    if proc.returncode != 0:
        return {"command": shown, "ok": False, "error": proc.stderr[-2000:]}
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    rows = [{"schedule": r["schedule"], "ttft_s": r["ttft"]["median"], "max_abs_diff": r["max_abs_diff"],
             "peak_mib": [f"{m.get('peak_bytes', 0) / 2**20:.0f}/{m.get('peak_reserved_bytes', 0) / 2**20:.0f}"
                          for m in r["memory"]]} for r in out["rows"]]
    return {"command": shown, "ok": True, "backend": {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}[acc.kind],
            "rows": rows, "memory_method": out.get("memory_method")}


def peak(acc, device) -> dict:
    """The allocator's peak allocated and reserved MiB since the last reset (CUDA/NPU; RSS on CPU)."""
    return {"peak_allocated_mib": acc.peak_memory(device) / 2**20,
            "peak_reserved_mib": acc.peak_memory_reserved(device) / 2**20}


def run_part(name: str, args, acc, device, preset: str) -> dict:
    """One part, in this process (called in the part's own subprocess). ``VPP_DEVICE_CHECK_FAIL=<part>``
    makes that part raise (the test of the isolation)."""
    if os.environ.get("VPP_DEVICE_CHECK_FAIL") == name:
        raise RuntimeError(f"part ({name}) failed on purpose (VPP_DEVICE_CHECK_FAIL)")
    if acc.kind != "cpu":
        acc.reset_peak_memory(device)
    if name == "a":
        return {"rows": check_families(acc, device), "kernels": kernels(device.type), **peak(acc, device)}
    if name == "b":
        return {**layer_law(acc, device, preset, args.dry_run), **peak(acc, device)}
    if name == "d":
        return {"runs": nccl_pair(acc, args.dry_run)}
    try:
        loop = one_device_pipeline(acc, device, args.dry_run)
    except Exception:
        loop = {"error": traceback.format_exc()}
    return {"loopback": loop, "two_ranks": two_ranks(acc, args.dry_run, args.timeout)}


def spawn_part(name: str, argv: list[str], folder: str) -> dict:
    """Run part ``name`` in a subprocess within LIMITS[name] seconds; its result, or {"error": ...}."""
    path = os.path.join(folder, f"part-{name}.json")
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--part", name, "--part-out", path]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LIMITS[name])
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        return {"error": f"part ({name}) ran past its {LIMITS[name]} s limit\n"
                         f"{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}"}
    if proc.returncode != 0 or not os.path.exists(path):
        return {"error": f"part ({name}) exited {proc.returncode}\n{proc.stderr[-3000:]}"}
    with open(path) as f:
        return json.load(f)


def _failed(parts: dict) -> bool:
    fam, c = parts["a"], parts["c"]
    if any("error" in p for p in parts.values()) or not all(r["ok"] for r in fam["rows"]):
        return True
    if "d" in parts and not all(run["ok"] for run in parts["d"]["runs"].values()):
        return True
    loop, pair = c["loopback"], c["two_ranks"]
    if isinstance(loop, dict) or any(r["max_abs_diff"] > 0.05 * max(r["ref_scale"], 1.0) for r in loop):
        return True
    return pair.get("ok") is False or any((r["max_abs_diff"] or 0) > 1e-2 for r in pair.get("rows", []))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "npu"))
    p.add_argument("--preset", choices=("h100", "h200", "910c", "cpu"), help="cost-model preset (default: from the device)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: rehearse every step")
    p.add_argument("--out", help="folder for device_check.md and .json (or the .md file's path)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for the 2-rank torchrun run")
    p.add_argument("--parts", default=DEFAULT_PARTS, help="comma-separated parts to run (default a,b,c; d is optional)")
    p.add_argument("--part", choices=tuple(LIMITS), help=argparse.SUPPRESS)
    p.add_argument("--part-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(1 if args.dry_run else torch.get_num_threads())
    acc = pick_device(args.device, args.dry_run)
    device = acc.device(0)
    if acc.kind != "cpu":
        acc.module().set_device(device)
    preset = args.preset or preset_for(acc, device)
    if args.part:
        result = run_part(args.part, args, acc, device, preset)
        with open(args.part_out, "w") as f:
            json.dump(result, f)
        return 0
    passed = ["--device", args.device, "--timeout", str(args.timeout), *(["--preset", args.preset] if args.preset else []),
              *(["--dry-run"] if args.dry_run else [])]
    with tempfile.TemporaryDirectory() as tmp:
        wanted = [x.strip() for x in args.parts.split(",") if x.strip()]
        if not wanted or set(wanted) - set(LIMITS):
            p.error(f"--parts={args.parts!r}: choose from {', '.join(LIMITS)}")
        with ThreadPoolExecutor(max_workers=len(wanted) if args.dry_run else 1) as pool:
            started = {name: pool.submit(spawn_part, name, passed, tmp) for name in LIMITS if name in wanted}
            parts = {name: started[name].result() if name in wanted else {"error": "not run (--parts)"}
                     for name in LIMITS if name != "d" or name in wanted}
    text = report(acc, device, parts, LIMITS)
    print(text)
    out = args.out or (None if args.dry_run else os.path.join(ROOT, "benchmarks", "results"))
    if out:
        md = out if out.endswith(".md") else os.path.join(out, "device_check.md")
        os.makedirs(os.path.dirname(os.path.abspath(md)), exist_ok=True)
        with open(md, "w") as f:
            f.write(text)
        with open(md[:-3] + ".json", "w") as f:
            json.dump({"device": str(device), "torch": torch.__version__, "parts": parts}, f, indent=1)
    return 1 if _failed(parts) else 0


if __name__ == "__main__":
    sys.exit(main())
