"""One script for an accelerator machine: what vpp does on a GPU or NPU, checked and timed in one go.

    python benchmarks/device_check.py [--device auto|cuda|npu] [--preset h100|h200|910c] [--out FILE]
    python benchmarks/device_check.py --dry-run      # CPU, tiny sizes: the same code paths, no claims

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
(c) With two or more devices: ``torchrun --nproc-per-node 2 -m vpp prefill ... --check`` on NCCL/HCCL
    (CPP, VPP, VPP-Async against an unpipelined forward).

Prints markdown, and writes it to ``--out`` (default ``benchmarks/results/device_check.md`` on an
accelerator; nothing by default in a dry run). Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's vpp (and tests.models.hf_tiny), not an installed one

import numpy as np  # noqa: E402
import torch  # noqa: E402

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
    from vpp.parallel.attention.kernel import kernel_for, lse_kernel_for
    from vpp.parallel.moe import expert_gemm_for
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
    from vpp.parallel.attention.workspace import set_workspace_bytes
    rows, groups = [], ParallelGroups.single(acc, device)
    ids = torch.randint(0, VOCAB, (PROMPTS["a"],), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
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
             "peak_mib": [round(m.get("peak_bytes", 0) / 2**20) for m in r["memory"]]} for r in out["rows"]]
    return {"command": shown, "ok": True, "backend": {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}[acc.kind],
            "rows": rows, "memory_method": out.get("memory_method")}


# --- report ------------------------------------------------------------------------------------------

def report(args, acc, device, fam, law, pair) -> str:
    name = "CPU (dry run: tiny sizes, no accelerator claims)" if acc.kind == "cpu" else \
        acc.module().get_device_name(device)
    lines = [f"# Device check: {name}", "",
             f"`python benchmarks/device_check.py {' '.join(sys.argv[1:])}` -- torch {torch.__version__}, "
             f"{platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}", "",
             f"## (a) tiny families in bf16 against transformers on {device}", "",
             f"Kernels: {kernels(device.type)}.", "",
             "Error of a position: max |logit - fp32 reference| / max |reference logit| (transformers in fp32 on "
             "the CPU); median [max] over the 37 positions, next-token agreement with the reference. Passes when "
             "vpp's median is at most twice transformers' own bf16 median + 0.01 and its agreement is within 0.1.", "",
             "| family | workspace | vpp bf16 error | transformers bf16 error | vpp agreement | transformers agreement | ok |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['family']} | {r['workspace']} | {r['vpp_err']:.1e} [{r['vpp_max']:.1e}] | "
              f"{r['hf_bf16_err']:.1e} [{r['hf_max']:.1e}] | {r['argmax_agree']:.2f} | {r['hf_agree']:.2f} | "
              f"{'yes' if r['ok'] else 'NO'} |" for r in fam]
    (a_m, b_m, r2_m), (a_p, b_p, r2_p) = law["fit_measured"], law["fit_predicted"]
    lines += ["", f"## (b) tau_k of one {law['model']} (layer {law['layer']}), {law['chunk']}-token chunks "
              f"to {law['tokens']} tokens, bf16", "",
              "| | tau_0 = a (ms) | b (ms per chunk) | R^2 | first chunk ms | last chunk ms |", "|---|---|---|---|---|---|",
              f"| measured | {a_m * 1e3:.2f} | {b_m * 1e3:.3f} | {r2_m:.3f} | {law['measured_s'][0] * 1e3:.2f} | "
              f"{law['measured_s'][-1] * 1e3:.2f} |",
              f"| cost model ({law['preset']}) | {a_p * 1e3:.2f} | {b_p * 1e3:.3f} | {r2_p:.3f} | "
              f"{law['predicted_s'][0] * 1e3:.2f} | {law['predicted_s'][-1] * 1e3:.2f} |", "",
              "Per chunk (ms), measured / predicted: " + ", ".join(
                  f"{m * 1e3:.1f}/{p * 1e3:.1f}" for m, p in zip(law["measured_s"], law["predicted_s"])), "",
              "## (c) two ranks, torchrun", ""]
    if "skipped" in pair:
        lines.append(f"Skipped: {pair['skipped']}.")
    elif not pair["ok"]:
        lines += [f"`{pair['command']}` FAILED:", "", "```", pair["error"], "```"]
    else:
        lines += [f"`{pair['command']}` ({pair['backend']}; peak memory: {pair['memory_method']})", "",
                  "| schedule | TTFT s | max abs diff vs unpipelined | peak MiB per rank |", "|---|---|---|---|"]
        lines += [f"| {r['schedule']} | {r['ttft_s']:.3f} | {r['max_abs_diff']:.2e} | {r['peak_mib']} |"
                  for r in pair["rows"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "npu"))
    p.add_argument("--preset", choices=("h100", "h200", "910c", "cpu"), help="cost-model preset (default: from the device)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: rehearse every step")
    p.add_argument("--out", help="markdown file to write")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the 2-rank run")
    args = p.parse_args(argv)
    torch.set_num_threads(1 if args.dry_run else torch.get_num_threads())
    acc = pick_device(args.device, args.dry_run)
    device = acc.device(0)
    if acc.kind != "cpu":
        acc.module().set_device(device)
    preset = args.preset or preset_for(acc, device)
    fam = check_families(acc, device)
    law = layer_law(acc, device, preset, args.dry_run)
    pair = two_ranks(acc, args.dry_run, args.timeout)
    text = report(args, acc, device, fam, law, pair)
    print(text)
    out = args.out or (None if args.dry_run else os.path.join(ROOT, "benchmarks", "results", "device_check.md"))
    if out:
        with open(out, "w") as f:
            f.write(text)
    failed = [r for r in fam if not r["ok"]] or (pair.get("ok") is False) or any(
        (r["max_abs_diff"] or 0) > 1e-2 for r in pair.get("rows", []))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
