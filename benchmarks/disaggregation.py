"""Prefill here, decode there: the KV hand-over and decoding on a TP group, measured on the tiny
models, and what disaggregation would give on the paper's deployment (modelled).

Measured (spawned CPU ranks, one thread each, pinned; one world of 4 ranks: a prefill instance
TP1 x PP2 on a V (vpp-async) and a decode instance TP2 x PP1). For each tiny model and prompt length:

* hand-over bytes: what the prefill ranks send, against the caches the decode ranks then hold and
  against the prefill's own caches (MLA's latent is replicated on each decode TP rank: twice the
  prefill's bytes at TP 2, every byte sent once);
* hand-over time (median of ``--rounds`` hand-overs of the same request after an untimed first one,
  which also opens the gloo connections; on the first decode rank): the whole call (the descriptor
  exchange and its bounded rendezvous included) and the transfer alone (plan to caches installed),
  against the link: the busiest receiver's bytes at the bandwidth of one prefill rank -> one decode
  rank, measured with a gloo send of that size;
* time per output token decoding in the prefill's V layout (the token goes down the ranks and back)
  and on the decode group, interleaved round by round (V, decode, V, ...), ``--steps`` tokens each.

``--decode-tp 1,2`` runs one world per decode TP size (1: a world of 3 ranks, the decode instance a
single rank; 2: 4 ranks).

Modelled (:mod:`vpp.perf.disaggregation_cost`, the paper's deployment: 16 Ascend 910C dies, TP8 x PP2,
the weight and cache formats of ``vpp.perf.runs``): decode time per token in the prefill's V, on a
decode instance of the same size as TP8 x PP2 (a loop) or TP16, whether it fits in HBM, and the
hand-over time from the prefill to each, at 128K-1M tokens.

    PYTHONPATH=. python benchmarks/disaggregation.py [--lengths 4096,8192] [--out benchmarks/results/disaggregation.md]
    PYTHONPATH=. python benchmarks/disaggregation.py --quick       # a smoke run (tests)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

PAPER_LENGTHS = (131072, 262144, 524288, 1048576)


def _pin(rank: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % 2 % len(cores)]})


def _bandwidth(link, nbytes: int, reps: int = 3) -> float | None:
    """Bytes/s from the prefill instance's first rank to the decode instance's first rank (gloo)."""
    import torch.distributed as dist
    src, dst = link.prefill_ranks[0], link.decode_ranks[0]
    me = link.groups.global_rank
    buf = torch.empty(max(nbytes // 4, 1), dtype=torch.float32)
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        if me == src:
            dist.send(buf, dst)
        elif me == dst:
            dist.recv(buf, src)
        times.append(time.perf_counter() - start)
    return buf.nbytes / statistics.median(times) if me == dst else None


def _world(rank, world, models, lengths, chunk, steps, rounds, decode_tp):
    import torch.distributed as dist

    from vpp.models.registry import open_model
    from vpp.models.run_layout import layout_for
    from vpp.parallel.instances import initialize_disaggregated
    from vpp.runtime import Pipeline, Sampler
    from vpp.kv.handover import hand_over, local_caches
    from vpp.runtime.watchdog import rendezvous

    torch.set_num_threads(1)
    _pin(rank)
    link = initialize_disaggregated(1, 2, decode_tp, 1)
    rows = []
    for name in models:
        model = open_model(name)
        layout = layout_for(model, "vpp-async", 2) if link.is_prefill else model.layout("loop", 1)
        pipe = Pipeline(model.stages(layout, link.groups), link.groups, timeout_s=1800)
        first = link.is_prefill and any(s.is_first for s in pipe.stages)
        greedy = Sampler()
        room = steps * rounds + 1
        for length in lengths:
            ids = torch.randint(0, model.config["vocab_size"], (length,), generator=torch.Generator().manual_seed(0))
            token = None
            prefill_bytes = 0
            if link.is_prefill:
                out = pipe.prefill(ids if first else None, chunk, schedule="vpp-async", request_ids=[0],
                                   decode_room=room)
                token = int(greedy.sample(pipe.next_logits(out, [0]))[0])
                prefill_bytes = sum(t.nbytes for t in local_caches(pipe, 0).values())
            reports = []
            for r in range(rounds + 1):  # the first: a warm-up, untimed
                reports.append(hand_over(pipe, link, [0] if link.is_prefill else None, payload=token,
                                         reserve=room, release=False))
                if r < rounds and not link.is_prefill:
                    pipe.release(0)
            reports = reports[1:]
            token = reports[-1].payload
            busiest = [None] * world
            dist.all_gather_object(busiest, (reports[-1].bytes_received, prefill_bytes, reports[-1].bytes_sent,
                                             reports[-1].cache_bytes))
            recv_max = max(b[0] for b in busiest)
            bw = _bandwidth(link, recv_max)
            # interleaved decode: in the prefill's V (prefill ranks), then on the TP group (decode ranks)
            v_tpot, tp_tpot, v_tokens, tp_tokens = [], [], [token], [token]
            for _ in range(rounds):
                for where, tokens, times in (("prefill", v_tokens, v_tpot), ("decode", tp_tokens, tp_tpot)):
                    # the idle instance waits sleeping (a store poll), not in a collective that may spin
                    rendezvous("a decode round", rank, world, timeout_s=1800)
                    if link.role == where:
                        start = time.perf_counter()
                        for _ in range(steps):
                            tokens.append(int(greedy.sample(pipe.decode(torch.tensor(tokens[-1:]), [0]))[0]))
                        times.append((time.perf_counter() - start) / steps)
            pipe.release(0)
            if link.groups.global_rank == link.decode_ranks[0]:
                rows.append(dict(model=name, length=length, handover_bytes=sum(b[2] for b in busiest),
                                 decode_kv_bytes=sum(b[3] for b in busiest), prefill_kv_bytes=sum(b[1] for b in busiest),
                                 busiest_bytes=recv_max, handover_s=[r.seconds for r in reports],
                                 transfer_s=[r.transfer_s for r in reports], link_bw=bw, decode_tp=decode_tp,
                                 tp_tpot=tp_tpot, tp_tokens=tp_tokens))
            if link.groups.global_rank == link.prefill_ranks[0]:
                rows.append(dict(model=name, length=length, v_tpot=v_tpot, v_tokens=v_tokens))
    return rows


def measured(models, lengths, chunk, steps, rounds, decode_tp) -> list[dict]:
    from vpp.parallel import run_distributed
    per_rank = run_distributed(_world, 2 + decode_tp, models, lengths, chunk, steps, rounds, decode_tp, timeout=7200)
    merged: dict = {}
    for rows in per_rank:
        for row in rows:
            merged.setdefault((row["model"], row["length"]), {}).update(row)
    return [merged[k] for k in sorted(merged, key=lambda k: (models.index(k[0]), k[1]))]


def _med(values, scale=1.0, digits=1) -> str:
    v = [x * scale for x in values]
    return f"{statistics.median(v):.{digits}f} [{min(v):.{digits}f}-{max(v):.{digits}f}]"


def measured_table(rows: list[dict]) -> str:
    lines = ["| model | prompt | decode TP | prefill KV MB | decode KV MB | handed over MB | hand-over ms | transfer ms | "
             "at link bw ms | link GB/s | TPOT V ms | TPOT decode ms | decode / V | same tokens |", "|---|" + "---|" * 13]
    for r in rows:
        ideal = r["busiest_bytes"] / r["link_bw"]
        ratio = [t / v for t, v in zip(r["tp_tpot"], r["v_tpot"])]
        lines.append(
            f"| {r['model']} | {r['length']} | {r['decode_tp']} | {r['prefill_kv_bytes'] / 1e6:.1f} | "
            f"{r['decode_kv_bytes'] / 1e6:.1f} | {r['handover_bytes'] / 1e6:.1f} | {_med(r['handover_s'], 1e3)} | "
            f"{_med(r['transfer_s'], 1e3)} | {1e3 * ideal:.1f} | "
            f"{r['link_bw'] / 1e9:.2f} | {_med(r['v_tpot'], 1e3)} | {_med(r['tp_tpot'], 1e3)} | {_med(ratio, 1, 2)} | "
            f"{'yes' if r['v_tokens'] == r['tp_tokens'] else 'no'} |")
    return "\n".join(lines)


def modelled_table(lengths=PAPER_LENGTHS) -> str:
    from vpp.perf.hardware import ASCEND_910C
    from vpp.perf.runs import MODELS, paper_setup
    from vpp.perf.disaggregation_cost import decode_step, handover
    from vpp.perf.ops import Parallel
    from vpp.schedules import make_layout

    lines = ["| model | tokens | TPOT in prefill's V (TP8xPP2) ms | TPOT decode TP8xPP2 loop ms | TPOT decode TP16 ms | "
             "hand-over to TP8xPP2: GB / s | hand-over to TP16: GB / s |", "|---|" + "---|" * 6]
    for m in MODELS:
        s = paper_setup(m, ASCEND_910C)
        a, dev = s.arch, s.device
        v, loop, one = (make_layout("v", a.layers, 2), make_layout("loop", a.layers, 2), make_layout("loop", a.layers, 1))
        p16 = Parallel(tp=16, weight_bytes=s.par.weight_bytes, kv_bytes=s.par.kv_bytes)
        for n in lengths:
            cells = []
            for par, lay in ((s.par, v), (s.par, loop), (p16, one)):
                d = decode_step(a, dev, par, lay, n)
                cells.append(f"{1e3 * d.seconds:.1f}" + ("" if d.fits else f" (does not fit: {d.rank_bytes / 1e9:.0f} GB)"))
            hand = [handover(a, dev, (s.par, v), dst, n) for dst in ((s.par, loop), (p16, one))]
            lines.append(f"| {m} | {n // 1024}K | " + " | ".join(cells) + " | "
                         + " | ".join(f"{h.total_bytes / 1e9:.1f} / {h.seconds:.3f}" for h in hand) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny-qwen,tiny-deepseek,tiny-glm")
    p.add_argument("--lengths", default="4096,8192")
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--steps", type=int, default=8, help="decode steps per round and contender")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--decode-tp", default="2", help="decode TP sizes, one world each (e.g. 1,2)")
    p.add_argument("--quick", action="store_true", help="one model, a 256-token prompt, 2 rounds (a smoke run)")
    p.add_argument("--out", help="write a markdown report here")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.lengths, args.chunk, args.steps, args.rounds = "tiny-deepseek", "256", 128, 2, 2
    models, lengths = args.models.split(","), [int(x) for x in args.lengths.split(",")]
    rows = [row for tp in args.decode_tp.split(",")
            for row in measured(models, lengths, args.chunk, args.steps, args.rounds, int(tp))]
    text = (f"## Measured: tiny models, prefill TP1 x PP2 (V, vpp-async, chunks of {args.chunk}) -> decode TP x PP1\n\n"
            + measured_table(rows) + "\n\n## Modelled: the paper's deployment (16 Ascend 910C dies), "
            "vpp.perf.disaggregation_cost\n\n" + modelled_table(PAPER_LENGTHS[:1] if args.quick else PAPER_LENGTHS))
    print(text)
    if args.out:
        cmd = "PYTHONPATH=. python benchmarks/disaggregation.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(args.out, "w") as f:
            f.write(f"# Prefill here, decode there\n\n`{cmd.strip()}`\n\n{__doc__.split(chr(10) + chr(10), 1)[1]}\n"
                    f"Spawned ranks on a 2-core machine shared with other work: 4 ranks on 2 cores (the idle "
                    f"instance waits in a barrier), median [min-max] of {args.rounds} rounds.\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
