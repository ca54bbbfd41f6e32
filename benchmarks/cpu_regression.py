"""No regression on CPU: ``vpp prefill`` of an older checkout against this one, side by side, and PP 2
VPP-Async against PP 1 at the same threads per rank.

    PYTHONPATH=. python benchmarks/cpu_regression.py --before /tmp/wt-before [--rounds 5] [--out DIR]
    PYTHONPATH=. python benchmarks/cpu_regression.py --quick        # the test suite's run

``--before`` is a checkout of the older commit (e.g. ``git worktree add --detach /tmp/wt-before
d9ebb77``); its ``vpp`` is imported by pointing PYTHONPATH at it, this checkout's by pointing it here
(``--quick`` uses this checkout for both, to exercise the mechanism). Each round runs, in an order that
rotates from round to round, three ``vpp prefill --json`` processes:

* before: PP 2, every schedule of ``--schedules``, on the older code;
* after: the same on this code;
* pp1: PP 1, ``cpp`` (the unpipelined baseline: one rank, no transfers), on this code.

Every process warms up once per schedule untimed and times one run (``--repeat 1``), with
``--threads`` torch threads per rank, ranks pinned to cores. Reported per schedule: the median and
min-max of TTFT over the rounds, after/before computed per round, and PP 2 / PP 1 per round (PP 2
ranks each have as many threads as the PP 1 rank: twice the cores, so 0.5 plus the bubble is ideal).
The model is a model directory written with :func:`vpp.models.save_checkpoint` (random weights) from
a DeepSeek-V3-shaped config, hidden 512, ``--layers`` layers, 8 routed experts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

MID_DEEPSEEK = {
    "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
    "vocab_size": 4096, "hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8,
    "num_key_value_heads": 8, "q_lora_rank": 384, "kv_lora_rank": 256, "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32, "v_head_dim": 64, "rope_interleave": True,
    "moe_intermediate_size": 384, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
    "first_k_dense_replace": 1, "num_nextn_predict_layers": 0, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False, "initializer_range": 0.02,
    "attention_bias": False, "bos_token_id": 0, "eos_token_id": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def make_model(out: Path, layers: int, hidden: int) -> Path:
    """A mid-sized DeepSeek-V3-shaped model directory with random weights (kept if already there)."""
    if (out / "config.json").exists():
        return out
    from vpp.models import save_checkpoint
    from vpp.models.build import random_checkpoint
    cfg = {**MID_DEEPSEEK, "num_hidden_layers": layers, "hidden_size": hidden,
           "intermediate_size": 3 * hidden}
    save_checkpoint(cfg, random_checkpoint(cfg, seed=0), out)
    return out


def prefill(code: Path, args, model: Path, pp: int, schedules: str) -> tuple[dict[str, float], dict[str, str]]:
    """One ``vpp prefill --json`` process on the checkout ``code``: ({schedule: TTFT s}, {schedule: layout})."""
    cmd = [sys.executable, "-c", "import sys; from vpp.cli import main; sys.exit(main())", "prefill",
           "--model", str(model), "--pp", str(pp), "--schedule", schedules, "--seq-len", str(args.seq_len),
           "--chunk-size", str(args.chunk_size), "--repeat", "1", "--threads", str(args.threads),
           "--partition", args.partition,
           "--json", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode:
        raise RuntimeError(f"vpp prefill on {code} (pp {pp}) exited {done.returncode}: {done.stderr[-2000:]}")
    out = json.loads(done.stdout[done.stdout.index("{"):])
    return {r["schedule"]: r["ttft"]["median"] for r in out["rows"]}, out["layouts"]


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "values": xs}


def run(args) -> dict:
    model_dir = args.model_dir or f"/tmp/vpp-deepseek-h{args.hidden}-l{args.layers}"
    model = make_model(Path(model_dir), args.layers, args.hidden)
    before = Path(args.before) if args.before else HERE
    jobs = {"before": (before, 2, args.schedules), "after": (HERE, 2, args.schedules), "pp1": (HERE, 1, "cpp")}
    names = list(jobs)
    rounds, layouts = [], {}
    for r in range(args.rounds):
        order = names[r % 3:] + names[:r % 3]  # rotate, so drift and first-in-round effects hit every side
        got = {}
        for name in order:
            t0 = time.perf_counter()
            got[name], layouts[name] = prefill(jobs[name][0], args, model, jobs[name][1], jobs[name][2])
            print(f"round {r + 1}/{args.rounds} {name}: " + ", ".join(f"{k} {v:.3f} s" for k, v in got[name].items())
                  + f" ({time.perf_counter() - t0:.0f} s wall)", file=sys.stderr, flush=True)
        rounds.append({"order": order, **got})
    schedules = args.schedules.split(",")
    rows = []
    for s in schedules:
        b = [rd["before"][s] for rd in rounds]
        a = [rd["after"][s] for rd in rounds]
        ratio = [x / y for x, y in zip(a, b)]
        vs_pp1 = [rd["after"][s] / rd["pp1"]["cpp"] for rd in rounds]
        vs_pp1_before = [rd["before"][s] / rd["pp1"]["cpp"] for rd in rounds]
        rows.append({"schedule": s, "before_s": spread(b), "after_s": spread(a), "after_over_before": spread(ratio),
                     "pp2_over_pp1": spread(vs_pp1), "pp2_before_over_pp1": spread(vs_pp1_before)})
    return {"config": {k: v for k, v in vars(args).items() if k != "out"}, "model": str(model),
            "load_average": os.getloadavg(), "pp1_s": spread([rd["pp1"]["cpp"] for rd in rounds]),
            "rows": rows, "rounds": rounds, "layouts": layouts}


def markdown(res: dict, command: str) -> str:
    def fmt(d, digits=3):
        return f"{d['median']:.{digits}f} [{d['min']:.{digits}f}-{d['max']:.{digits}f}]"
    c = res["config"]
    lines = [
        "# CPU regression: `vpp prefill` before and after, PP 2 against PP 1", "",
        f"Command: `{command}`", "",
        f"Model: DeepSeek-V3 shape, hidden {c['hidden']}, {c['layers']} layers, 8 routed experts (random "
        f"weights); {c['seq_len']} tokens in chunks of {c['chunk_size']}, {c['threads']} thread(s) per rank, "
        f"float32, --partition {c['partition']}. {c['rounds']} rounds; per round three `vpp prefill --json --repeat 1` processes (before PP 2, "
        f"after PP 2, after PP 1 cpp) in a rotating order, each warmed up once per schedule. Before: "
        f"`{c['before'] or 'this checkout'}`. Load average at the end: "
        + ", ".join(f"{x:.1f}" for x in res["load_average"]) + " on a 2-core machine shared with other agents.", "",
        f"PP 1 (cpp, one rank) TTFT: {fmt(res['pp1_s'])} s, median [min-max].", "",
        "| schedule (PP 2) | before TTFT s | after TTFT s | after / before (per round) | PP 2 / PP 1 after "
        "(per round) | PP 2 / PP 1 before |",
        "|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(f"| {r['schedule']} | {fmt(r['before_s'])} | {fmt(r['after_s'])} | "
                     f"{fmt(r['after_over_before'])} | {fmt(r['pp2_over_pp1'])} | {fmt(r['pp2_before_over_pp1'])} |")
    lines += ["", "Layouts (layers per stage):", ""] + [f"- {name}: " + "; ".join(f"{k}: {v}" for k, v in lay.items())
                                                     for name, lay in res["layouts"].items()]
    lines += ["", "Per round (s):", "", "| round | order | pp1 cpp | " + " | ".join(
        f"before {r['schedule']} | after {r['schedule']}" for r in res["rows"]) + " |",
        "|" + "---|" * (3 + 2 * len(res["rows"]))]
    for i, rd in enumerate(res["rounds"]):
        lines.append(f"| {i + 1} | {' '.join(rd['order'])} | {rd['pp1']['cpp']:.3f} | " + " | ".join(
            f"{rd['before'][r['schedule']]:.3f} | {rd['after'][r['schedule']]:.3f}" for r in res["rows"]) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a checkout of the older commit (default: this checkout)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model-dir", help="written there if it has no config.json (default: "
                    "/tmp/vpp-deepseek-h{hidden}-l{layers})")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--schedules", default="cpp,vpp-async")
    ap.add_argument("--partition", default="rank", choices=("rank", "even"),
                    help="vpp prefill --partition (the two checkouts may choose different 'rank' partitions)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank (PP 1 and PP 2 alike)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per vpp prefill process")
    ap.add_argument("--quick", action="store_true",
                    help="1 round, 4 layers, hidden 128, 256 tokens in chunks of 64, this checkout as before")
    ap.add_argument("--out", help="write cpu_regression.json and .md into this folder")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.layers, args.hidden, args.seq_len, args.chunk_size = 1, 4, 128, 256, 64
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    res = run(args)
    command = "PYTHONPATH=. python benchmarks/cpu_regression.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(res, command)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "cpu_regression.json").write_text(json.dumps(res, indent=1) + "\n")
        Path(args.out, "cpu_regression.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
