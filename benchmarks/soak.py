"""A soak of one ``Pipeline``: many requests, good and bad, on spawned CPU ranks; nothing may be lost.

    PYTHONPATH=. python benchmarks/soak.py [--requests 300] [--ranks 2] [--model tiny-deepseek] [--seed 0]
                                           [--quick] [--out benchmarks/results/soak.md]

One Pipeline per rank (a V over ``--ranks`` ranks) serves a stream built from one seed, the same on every
rank: batches of 1-3 requests with random prompt lengths, arrival offsets (a stream prefill with
``arrivals``) and new-token counts, each batch prefilled under one of two schedules (vpp, vpp-async) and
decoded greedily, a request leaving the batch when it has its tokens (its caches released at once). Bad
requests are mixed in: an empty prompt, a prompt longer than the model's positions, token ids outside the
vocabulary, and a request cancelled after its first decoded token (released mid-decode). The prompts are
given only to the rank holding stage 0, so every error travels through the prompts' exchange.

Checked, per rank: every bad request got its error (the same on every rank) and the next request ran;
every good request's tokens equal a fresh run's (a new Pipeline on freshly built stages, the request
alone, ``Pipeline.generate``); no caches are left on any stage; the resident set's slope (least squares
over the second half of the requests, MiB per 100 requests); threads and open file descriptors before
and after (after a warm-up); child processes left (in every rank and in the parent, after the ranks end).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time

import torch

from vpp.parallel import initialize_model_parallel, run_distributed
from vpp.runtime import Pipeline

MIB = 2 ** 20
SCHEDULES = ("vpp", "vpp-async")
BAD = ("empty", "too long", "out of vocabulary", "cancelled")


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if int(fields[1]) != pid or fields[0] == "Z" or b"resource_tracker" in cmd:
            continue
        if b"multiprocessing.forkserver" in cmd:  # vpp's rank server stays with its launcher; its ranks count
            out.extend(_children(int(entry)))
            continue
        out.append(int(entry))
    return out


def workload(n: int, seed: int, vocab: int, max_positions: int, quick: bool) -> list[list[dict]]:
    """Batches of requests, the same on every rank: dicts with id, kind, ids, new, arrival."""
    rng = random.Random(seed)
    lo, hi = (8, 96) if quick else (16, 384)
    batches, made = [], 0
    while made < n:
        batch = []
        if made % 6 == 2:  # one request in six is bad, the kinds in turn, alone in its batch (a bad prompt
            q = {"id": made, "kind": BAD[(made // 6) % len(BAD)], "new": rng.randint(3, 6), "arrival": 0.0}
            q["ids"] = [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))]  # fails the whole stream call)
            if q["kind"] == "empty":
                q["ids"] = []
            elif q["kind"] == "too long":
                q["ids"] = [1] * (max_positions + 1)
            elif q["kind"] == "out of vocabulary":
                q["ids"][len(q["ids"]) // 2] = vocab + 7
            batches.append([q])
            made += 1
            continue
        for _ in range(min(rng.randint(1, 3), n - made)):
            q = {"id": made, "kind": "good", "new": rng.randint(1, 6), "arrival": round(rng.uniform(0, 0.02), 4)}
            q["ids"] = [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))]
            batch.append(q)
            if made % 6 == 1:  # the next one is bad: it goes alone
                made += 1
                break
            made += 1
        batches.append(batch)
    return batches


def _serve(pipe: Pipeline, batch: list[dict], schedule: str, first: bool, outcome: dict, on_done) -> None:
    """Prefill the batch as a stream, then decode it; bad prompts make the prefill raise (every rank)."""
    prompts = [torch.tensor(q["ids"], dtype=torch.long) for q in batch]
    ids = [q["id"] for q in batch]
    try:
        out = pipe.prefill(prompts if first else None, 32, schedule=schedule, request_ids=ids,
                           arrivals=[q["arrival"] for q in batch], decode_room=max(q["new"] for q in batch))
    except ValueError as exc:
        for q in batch:
            outcome[q["id"]] = ("error", str(exc))
            on_done()
        return
    tokens = {q: [int(t)] for q, t in zip(ids, pipe.next_logits(out, ids).argmax(-1))}
    want = {q["id"]: q["new"] for q in batch}
    cancel = {q["id"] for q in batch if q["kind"] == "cancelled"}
    live = []
    for q in ids:
        if q in cancel or len(tokens[q]) >= want[q]:
            pipe.release(q)
            outcome[q] = ("cancelled", tokens[q]) if q in cancel else ("tokens", tokens[q])
            on_done()
        else:
            live.append(q)
    while live:
        logits = pipe.decode(torch.tensor([tokens[q][-1] for q in live]), live)
        for q, t in zip(live, logits.argmax(-1).tolist()):
            tokens[q].append(int(t))
        for q in [q for q in live if len(tokens[q]) >= want[q]]:
            live.remove(q)
            pipe.release(q)
            outcome[q] = ("tokens", tokens[q])
            on_done()


def soak_rank(rank: int, world: int, model_name: str, n: int, seed: int, quick: bool) -> dict:
    from vpp.models.registry import open_model
    groups = initialize_model_parallel(1, world)
    model = open_model(model_name)
    layout = model.layout("v", world)
    stages = model.stages(layout, groups)
    first = any(s.is_first for s in stages)
    pipe = Pipeline(stages, groups, timeout_s=300)
    vocab, limit = int(model.config["vocab_size"]), int(model.config["max_position_embeddings"])
    batches = workload(n, seed, vocab, limit, quick)
    rng = random.Random(seed + 1)
    warm = {}  # warm-up batches (kernels, plans, gloo buffers, lazily started threads) before the baselines
    for i, schedule in enumerate(SCHEDULES):
        _serve(pipe, [{"id": -1 - i, "kind": "good", "ids": list(range(40)), "new": 3, "arrival": 0.001},
                      {"id": -10 - i, "kind": "good", "ids": list(range(20)), "new": 2, "arrival": 0.0}],
               schedule, first, warm, lambda: None)
    threads0, tasks0, fds0 = threading.active_count(), len(os.listdir("/proc/self/task")), _fds()
    names0 = sorted(t.name for t in threading.enumerate())
    outcome: dict = {}
    rss: list[tuple[int, int]] = []

    def done():
        rss.append((len(outcome), _status("VmRSS") * 1024))

    start = time.perf_counter()
    for batch in batches:
        _serve(pipe, batch, rng.choice(SCHEDULES), first, outcome, done)
    wall = time.perf_counter() - start
    # the watchdog's daemon thread of the last call exits once it reads its stop: give it a moment
    deadline = time.monotonic() + 5.0
    while threading.active_count() > threads0 and time.monotonic() < deadline:
        time.sleep(0.05)
    left = {s.layer_range: s.requests() for s in stages if s.requests()}
    cache_bytes = sum(s.cache_nbytes() for s in stages)
    after = (threading.active_count(), len(os.listdir("/proc/self/task")), _fds(), _children(os.getpid()),
             sorted(t.name for t in threading.enumerate()))  # measured before the fresh runs below
    # a fresh run of every request that produced tokens: new stages, a new Pipeline, the request alone
    fresh_stages = model.stages(layout, groups)
    fresh = Pipeline(fresh_stages, groups, timeout_s=300)
    reference = {}
    for batch in batches:
        for q in batch:
            if outcome[q["id"]][0] != "tokens":
                continue
            ids = torch.tensor(q["ids"], dtype=torch.long)
            gen = fresh.generate(ids if first else None, q["new"], 32, schedule="vpp", request_ids=[q["id"]])
            reference[q["id"]] = gen.tokens[q["id"]]
    return {"rank": rank, "outcome": outcome, "reference": reference, "rss": rss, "wall_s": wall,
            "threads": (threads0, after[0]), "tasks": (tasks0, after[1]),
            "fds": (fds0, after[2]), "children": after[3],
            "thread_names": (names0, after[4]), "caches_left": left,
            "cache_bytes_left": cache_bytes, "kinds": {q["id"]: q["kind"] for b in batches for q in b},
            "requests": n}


def slope_per_100(samples: list[tuple[int, int]]) -> float:
    """Least-squares slope of RSS (MiB) against requests served, per 100 requests, over the second half."""
    pts = samples[len(samples) // 2:]
    if len(pts) < 2:
        return float("nan")
    xs, ys = [p[0] for p in pts], [p[1] / MIB for p in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 100 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else float("nan")


def summarize(results: list[dict], parent_children: list[int]) -> dict:
    r0 = results[0]
    kinds = r0["kinds"]
    same_everywhere = all(r["outcome"] == r0["outcome"] for r in results)
    bad = {q: k for q, k in kinds.items() if k not in ("good",)}
    errors = {q: r0["outcome"][q] for q, k in bad.items() if k != "cancelled"}
    bad_ok = all(r0["outcome"][q][0] == "error" for q in errors) and \
        all(r0["outcome"][q][0] == "cancelled" for q, k in bad.items() if k == "cancelled")
    good = [q for q, k in kinds.items() if k == "good"]
    mismatched = [q for q in good if r0["outcome"][q] != ("tokens", r0["reference"].get(q))]
    return {
        "requests": r0["requests"], "good": len(good), "good_served": sum(r0["outcome"][q][0] == "tokens" for q in good),
        "tokens_equal_fresh": len(good) - len(mismatched), "mismatched": mismatched,
        "bad": {k: sum(1 for q in bad if kinds[q] == k) for k in BAD}, "bad_handled": bad_ok,
        "errors": sorted({v[1] for v in errors.values()}), "same_on_every_rank": same_everywhere,
        "per_rank": [{"rank": r["rank"], "rss_slope_mib_per_100": slope_per_100(r["rss"]),
                      "rss_first_last_mib": (r["rss"][0][1] / MIB, r["rss"][-1][1] / MIB) if r["rss"] else None,
                      "threads": r["threads"], "thread_names": r["thread_names"], "tasks": r["tasks"], "fds": r["fds"], "children": r["children"],
                      "caches_left": r["caches_left"], "cache_bytes_left": r["cache_bytes_left"], "wall_s": r["wall_s"]}
                     for r in results],
        "parent_children": parent_children,
    }


def passed(s: dict) -> bool:
    ranks_ok = all(p["threads"][1] <= p["threads"][0] and p["fds"][1] <= p["fds"][0] and not p["children"]
                   and not p["caches_left"] and p["cache_bytes_left"] == 0 for p in s["per_rank"])
    return (s["good_served"] == s["good"] and not s["mismatched"] and s["bad_handled"] and s["same_on_every_rank"]
            and ranks_ok and not s["parent_children"])


def markdown(s: dict, command: str, load: tuple) -> str:
    lines = ["# Soak: one Pipeline, many requests", "", f"`{command}` -- load average {load[0]:.1f} {load[1]:.1f} "
             f"{load[2]:.1f} (a machine shared with other work).", "",
             f"- requests: {s['requests']} ({s['good']} good, bad: " + ", ".join(f"{k} {v}" for k, v in s['bad'].items()) + ")",
             f"- good requests served: {s['good_served']} / {s['good']}; tokens equal to a fresh run's: "
             f"{s['tokens_equal_fresh']} / {s['good']}" + (f" (mismatched: {s['mismatched']})" if s['mismatched'] else ""),
             f"- bad requests: every one got its error (cancelled ones released): {s['bad_handled']}; the same outcome "
             f"on every rank: {s['same_on_every_rank']}",
             "- errors returned: " + "; ".join(f"`{e[:150]}`" for e in s["errors"]),
             f"- child processes left in the parent after the ranks ended: {s['parent_children'] or 'none'}", "",
             "| rank | RSS slope (MiB / 100 requests, 2nd half) | RSS first -> last (MiB) | Python threads before -> after | "
             "OS tasks before -> after | fds before -> after | children left | caches left | s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in s["per_rank"]:
        first, last = p["rss_first_last_mib"] or (float("nan"), float("nan"))
        lines.append(f"| {p['rank']} | {p['rss_slope_mib_per_100']:+.2f} | {first:.1f} -> {last:.1f} | "
                     f"{p['threads'][0]} -> {p['threads'][1]} | {p['tasks'][0]} -> {p['tasks'][1]} | "
                     f"{p['fds'][0]} -> {p['fds'][1]} | {len(p['children'])} | {p['cache_bytes_left']} B | "
                     f"{p['wall_s']:.0f} |")
    for p in s["per_rank"]:
        before, after = p["thread_names"]
        extra = sorted(set(after) - set(before))
        if extra:
            lines.append(f"- rank {p['rank']}: threads alive at the end that were not at the start: {extra}")
    lines += ["", f"Result: {'PASS' if passed(s) else 'FAIL'}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--model", default="tiny-deepseek")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a smoke run: 24 short requests")
    p.add_argument("--out", default=os.path.join("benchmarks", "results", "soak.md"))
    args = p.parse_args(argv)
    n = 24 if args.quick else args.requests
    results = run_distributed(soak_rank, args.ranks, args.model, n, args.seed, args.quick, timeout=7200.0)
    summary = summarize(results, _children(os.getpid()))
    command = "PYTHONPATH=. python benchmarks/soak.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = markdown(summary, command.strip(), os.getloadavg())
    print(text)
    if args.out:
        from vpp.safe_write import write_text
        write_text(args.out, text)
    return 0 if passed(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
