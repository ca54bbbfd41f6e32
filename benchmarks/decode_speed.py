"""Time per output token of vpp's decode against transformers' ``generate``, same weights, same CPU,
one thread, in one process (vpp at PP 1 on ``ParallelGroups.single()``).

Each family (Qwen3-MoE, DeepSeek-V3, DeepSeek-V3.2, GLM-5) as a random model of our own
configuration (hidden 512, 4 layers, 8 experts: the family's tiny config widened), written once as a
Hugging Face checkpoint (``vpp.models.save_checkpoint``) and loaded by both. A greedy generation
after a prompt of ``--prompt`` tokens; transformers' time per token is taken from a streamer's
timestamps (first new token to last), vpp's from ``Generation.time_per_output_token_s`` (the decode
steps). Rounds interleave the contenders (vpp, transformers, vpp, ...) after one warm-up each; the
ratio is computed per round. The greedy tokens of both are compared (``same tokens``).

    PYTHONPATH=. python benchmarks/decode_speed.py [--rounds 5] [--out benchmarks/results/decode_speed.md]
    PYTHONPATH=. python benchmarks/decode_speed.py --quick      # a smoke run (tests)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

from vpp.models import save_checkpoint
from vpp.models.build import random_checkpoint
from vpp.models.registry import open_model
from vpp.models.tiny import TINY_CONFIGS
from vpp.parallel.groups import ParallelGroups
from vpp.runtime import Pipeline

WIDE = {"hidden_size": 512, "num_hidden_layers": 4, "intermediate_size": 1024, "moe_intermediate_size": 256,
        "num_experts_per_tok": 2, "vocab_size": 4096}


def family_configs(quick: bool) -> dict[str, dict]:
    """The four families' configs (hidden 512, 4 layers, 8 experts; --quick: 2 layers, hidden 128)."""
    wide = dict(WIDE, **({"hidden_size": 128, "num_hidden_layers": 2, "vocab_size": 512} if quick else {}))
    layers = wide["num_hidden_layers"]
    qwen = dict(TINY_CONFIGS["tiny-qwen"], **wide, num_experts=8)
    ds = dict(TINY_CONFIGS["tiny-deepseek"], **wide, n_routed_experts=8, n_group=2, topk_group=1)
    v32 = dict(ds, model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"], index_topk=256,
               index_n_heads=8, index_head_dim=32)
    glm = dict(TINY_CONFIGS["tiny-glm"], **wide, n_routed_experts=8,
               indexer_types=(["full", "full", "shared", "full"] * layers)[:layers])
    return {"qwen3_moe": qwen, "deepseek_v3": ds, "deepseek_v32": v32, "glm_moe_dsa": glm}


class _Stamps:
    """A transformers streamer that records when each batch of tokens arrives."""

    def __init__(self):
        self.times: list[float] = []
        self.tokens: list[int] = []

    def put(self, value):
        self.times.append(time.perf_counter())
        self.tokens.extend(int(t) for t in value.reshape(-1).tolist())

    def end(self):
        pass


def _hf_round(hf, ids, new):
    stamps = _Stamps()
    with torch.no_grad():
        hf.generate(ids[None], attention_mask=torch.ones_like(ids)[None], max_new_tokens=new, do_sample=False,
                    pad_token_id=0, eos_token_id=None, streamer=stamps)
    times = stamps.times[1:]  # the first put is the prompt
    return (times[-1] - times[0]) / (len(times) - 1), stamps.tokens[ids.numel():]


def _vpp_round(pipe, ids, new, chunk):
    gen = pipe.generate(ids, new, chunk, schedule="cpp")
    return gen.time_per_output_token_s, gen.tokens[0]


def measure(name: str, config: dict, prompt: int, new: int, rounds: int, root: str) -> dict:
    from transformers import AutoModelForCausalLM
    path = os.path.join(root, name)
    save_checkpoint(config, random_checkpoint(config, seed=0), path)
    hf = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    model = open_model(path)
    groups = ParallelGroups.single()
    pipe = Pipeline(model.stages(model.layout("loop", 1), groups), groups)
    ids = torch.randint(0, config["vocab_size"], (prompt,), generator=torch.Generator().manual_seed(0))
    _vpp_round(pipe, ids, 4, prompt), _hf_round(hf, ids, 4)  # warm-up
    vpp_t, hf_t, ratios, same = [], [], [], True
    for _ in range(rounds):
        v, v_tokens = _vpp_round(pipe, ids, new, prompt)
        h, h_tokens = _hf_round(hf, ids, new)
        vpp_t.append(v)
        hf_t.append(h)
        ratios.append(v / h)
        same = same and v_tokens == h_tokens
    return dict(model=name, vpp_ms=[1e3 * t for t in vpp_t], hf_ms=[1e3 * t for t in hf_t], ratio=ratios,
                same_tokens=same)


def _fmt(values, digits=2) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def table(rows: list[dict]) -> str:
    lines = ["| model | vpp ms/token | transformers ms/token | vpp / transformers (per round) | same tokens |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {_fmt(r['vpp_ms'])} | {_fmt(r['hf_ms'])} | {_fmt(r['ratio'])} | "
                     f"{'yes' if r['same_tokens'] else 'no'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--models", default="qwen3_moe,deepseek_v3,deepseek_v32,glm_moe_dsa")
    p.add_argument("--quick", action="store_true", help="small models, 2 rounds, short prompt (a smoke run)")
    p.add_argument("--out", help="write a markdown report here")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.prompt, args.new = 2, 64, 6
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    configs = family_configs(args.quick)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for name in args.models.split(","):
            rows.append(measure(name, configs[name], args.prompt, args.new, args.rounds, root))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    print(text)
    if args.out:
        cmd = "PYTHONPATH=. python benchmarks/decode_speed.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(args.out, "w") as f:
            f.write(f"# Decode: vpp vs transformers per output token (measured)\n\n`{cmd.strip()}`\n\n"
                    f"One process, one thread, pinned to one core; greedy, {args.prompt}-token prompt, {args.new} new "
                    f"tokens; {args.rounds} interleaved rounds after a warm-up, median [min-max]; random models of "
                    f"our own configuration (hidden {configs['qwen3_moe']['hidden_size']}, "
                    f"{configs['qwen3_moe']['num_hidden_layers']} layers, 8 experts). The machine is shared with "
                    f"other work (2 cores), so absolute times drift; the ratio is per round.\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
