"""The report of ``benchmarks/device_check.py``: parts (a) families, (b) tau_k of one layer, (c) the
executor's device path, as markdown."""

from __future__ import annotations

import platform
import sys
import time

import torch

def _error_block(what: str, part: dict) -> list[str]:
    return [f"{what} FAILED:", "", "```", part["error"][-3000:], "```"]


def report(acc, device, parts: dict, limits: dict) -> str:
    """The markdown report of parts (a), (b) and (c) as :mod:`benchmarks.device_check` collected them."""
    name = "CPU (dry run: tiny sizes, no accelerator claims)" if acc.kind == "cpu" else \
        acc.module().get_device_name(device)
    fam, law, c = parts["a"], parts["b"], parts["c"]
    lines = [f"# Device check: {name}", "",
             f"`PYTHONPATH=. python3 benchmarks/device_check.py {' '.join(sys.argv[1:])}` -- torch {torch.__version__}, "
             f"{platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}; each part in its own process "
             f"(limits {limits} s)", "",
             f"## (a) tiny families in bf16 against transformers on {device}", ""]
    if "error" in fam:
        lines += _error_block("part (a)", fam)
    else:
        lines += [f"Kernels: {fam['kernels']}.", "",
                  "Error of a position: max |logit - fp32 reference| / max |reference logit| (transformers in fp32 "
                  "on the CPU); median [max] over the 37 positions, next-token agreement with the reference. Passes "
                  "when vpp's median is at most twice transformers' own bf16 median + 0.01 and its agreement is "
                  "within 0.1. " + _mem(fam), "",
                  "| family | workspace | vpp bf16 error | transformers bf16 error | vpp agreement | "
                  "transformers agreement | ok |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['family']} | {r['workspace']} | {r['vpp_err']:.1e} [{r['vpp_max']:.1e}] | "
                  f"{r['hf_bf16_err']:.1e} [{r['hf_max']:.1e}] | {r['argmax_agree']:.2f} | {r['hf_agree']:.2f} | "
                  f"{'yes' if r['ok'] else 'NO'} |" for r in fam["rows"] if "skipped" not in r]
        lines += [f"Skipped {r['family']}: {r['skipped']}." for r in fam["rows"] if "skipped" in r]
    lines += ["", "## (b) tau_k of one layer, bf16", ""]
    if "error" in law:
        lines += _error_block("part (b)", law)
    else:
        (a_m, b_m, r2_m), (a_p, b_p, r2_p) = law["fit_measured"], law["fit_predicted"]
        lines += [f"{law['model']} (layer {law['layer']}), {law['chunk']}-token chunks to {law['tokens']} tokens. "
                  + _mem(law), "",
                  "| | tau_0 = a (ms) | b (ms per chunk) | R^2 | first chunk ms | last chunk ms |",
                  "|---|---|---|---|---|---|",
                  f"| measured | {a_m * 1e3:.2f} | {b_m * 1e3:.3f} | {r2_m:.3f} | {law['measured_s'][0] * 1e3:.2f} | "
                  f"{law['measured_s'][-1] * 1e3:.2f} |",
                  f"| cost model ({law['preset']}) | {a_p * 1e3:.2f} | {b_p * 1e3:.3f} | {r2_p:.3f} | "
                  f"{law['predicted_s'][0] * 1e3:.2f} | {law['predicted_s'][-1] * 1e3:.2f} |", "",
                  "Per chunk (ms), measured / predicted: " + ", ".join(
                      f"{m * 1e3:.1f}/{p * 1e3:.1f}" for m, p in zip(law["measured_s"], law["predicted_s"]))]
    lines += ["", "## (c) the executor's device path", "", "### one device: two ranks as threads, loopback transfers", ""]
    if "error" in c:
        lines += _error_block("part (c)", c)
        return "\n".join(lines + (pair_lines(parts["d"]) if "d" in parts else [])) + "\n"
    loop = c["loopback"]
    if isinstance(loop, dict):
        lines += _error_block("the loopback run", loop)
    else:
        lines += ["Host waits per chunk (on a transfer: a Work.wait() before the peer posted; on a compute: the "
                  f"run-ahead bound of {loop[0]['run_ahead_computes'] if loop else '-'} computes), receive overlap "
                  "from device events (steady state / all receives), logits against an unpipelined forward.", "",
                  "| loopback | layout | host waits on transfers / chunk | host waits on computes / chunk | "
                  "recv overlap steady | recv overlap all | max abs diff (of max logit) | wall s | peak alloc / "
                  "reserved MiB |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| loopback {r['schedule']} | {r['layout']} | {r['host_blocking_waits_per_chunk']:.2f} | "
                  f"{r['host_compute_waits_per_chunk']:.2f} | {r['recv_overlap']:.3f} | {r['recv_overlap_all']:.3f} | "
                  f"{r['max_abs_diff']:.2e} ({r['ref_scale']:.1f}) | {r['wall_s']:.3f} | "
                  f"{r['peak_allocated_mib']:.0f} / {r['peak_reserved_mib']:.0f} |" for r in loop]
    lines += ["", "### two ranks, torchrun", ""]
    pair = c["two_ranks"]
    if "skipped" in pair:
        lines.append(f"Skipped: {pair['skipped']}.")
    elif not pair["ok"]:
        lines += [f"`{pair['command']}` FAILED:", "", "```", pair["error"], "```"]
    else:
        lines += [f"`{pair['command']}` ({pair['backend']}; peak memory: {pair['memory_method']})", "",
                  "| schedule | TTFT s | max abs diff vs unpipelined | peak MiB per rank (allocated/reserved) |",
                  "|---|---|---|---|"]
        lines += [f"| {r['schedule']} | {r['ttft_s']:.3f} | {r['max_abs_diff']:.2e} | {r['peak_mib']} |"
                  for r in pair["rows"]]
    if "d" in parts:
        lines += pair_lines(parts["d"])
    return "\n".join(lines) + "\n"


def pair_lines(d: dict) -> list[str]:
    """Part (d): two ranks on one device (NCCL with a host id each; gloo in a dry run)."""
    lines = ["", "## (d) two NCCL ranks on one GPU (NCCL_HOSTID per rank, loopback sockets)", ""]
    if "error" in d:
        return lines + _error_block("part (d)", d)
    lines += ["| init | backend | warm-up s | max abs diff | idle gap > timeout | dead peer: named, s (limit) | ok |",
              "|---|---|---|---|---|---|---|"]
    for mode, run in d["runs"].items():
        r = run["reports"][0]
        if "error" in r:
            lines.append(f"| {mode} | {run['backend']} | rank 0 failed: {r['error'][-300:]!r} | | | | NO |")
            continue
        f, gap = r.get("fault", {}), r.get("idle_gap", {})
        lines.append(f"| {mode} | {run['backend']} | {r['warm_s']:.2f} | {r.get('max_abs_diff', float('nan')):.1e} | "
                     f"{gap.get('gap_s', 0):g} s gap, {gap.get('timeout_s', 0):g} s timeout: requests {gap.get('requests')} | "
                     f"global rank {f.get('named_global_rank')}, {f.get('wall_s', 0):.1f} ({f.get('within_s', 0):g}) | "
                     f"{'yes' if run['ok'] else 'NO'} |")
    return lines


def _mem(part: dict) -> str:
    return f"Peak memory: {part['peak_allocated_mib']:.0f} MiB allocated, {part['peak_reserved_mib']:.0f} MiB reserved."


__all__ = ["report"]
