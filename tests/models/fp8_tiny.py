"""Tiny FP8 block-quantized checkpoints in the official layout (DeepSeek-V3 / Qwen3 FP8 releases),
made here from the random transformers models of :mod:`tests.models.hf_tiny`, and the reference:
transformers' forward on the dequantized weights.

Layout: each quantized ``X.weight`` is float8_e4m3fn with ``X.weight_scale_inv`` (float32, one per
[24 x 32] block: the real weight is the FP8 value times its block's scale); router gates, norms,
embeddings, the LM head and the indexer's ``weights_proj`` stay unquantized, in bf16 as in the
releases; config.json carries ``quantization_config`` and ``torch_dtype: bfloat16``.

Widths are chosen so that blocks are partial and TP slices start inside blocks: hidden 72 (3 column
blocks of 32, the last 8 wide), intermediate 88 (TP 2 rows [44, 88) start inside row block [24, 48);
columns [44, 88) inside column block [32, 64)), moe_intermediate 40 (TP 2: rows and columns from 20),
kv_b 128 rows (TP 2 from row 64, inside [48, 72)), q_lora 24 (one partial column block). The block
is not square, so swapping rows and columns anywhere shows.

Quantization here is written independently of vpp (a loop over blocks), and the dequantized
reference weights come from transformers' own FP8 dequantization routine. Imported only by the
pytest process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

from tests.models import hf_tiny

BLOCK = (24, 32)
WIDTHS = dict(hidden_size=72, intermediate_size=88, moe_intermediate_size=40)
FP8_MAX = 448.0  # largest finite float8_e4m3fn
WORDS = ["the", "model", "reads", "each", "slice", "of", "its", "weights", "once", "and", "long", "prompts",
         "are", "cut", "into", "chunks", "that", "flow", "through", "a", "pipeline", "ranks", "stay", "busy",
         "when", "stages", "fold", "back", "in", "V", ".", ","]


def quantized(name: str, shape) -> bool:
    """The releases' choice: attention, MLP and expert projections and the DSA indexer's wq_b and wk
    are FP8; router gates, weights_proj, norms, embeddings and the LM head are not."""
    if len(shape) != 2 or ".layers." not in name or name.endswith(("mlp.gate.weight", "weights_proj.weight")):
        return False
    return name.endswith(("_proj.weight", "_mqa.weight", "wq_b.weight", "wk.weight"))


def quantize(w: torch.Tensor, block=BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn values, float32 scale_inv) with each block's max |value| at FP8's largest."""
    bo, bi = block
    rows, cols = w.shape
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scale = torch.empty(-(-rows // bo), -(-cols // bi))
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            blk = w[i * bo:(i + 1) * bo, j * bi:(j + 1) * bi].float()
            s = blk.abs().max().clamp(min=1e-12) / FP8_MAX
            q[i * bo:(i + 1) * bo, j * bi:(j + 1) * bi] = (blk / s).to(torch.float8_e4m3fn)
            scale[i, j] = s
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, block=BLOCK) -> torch.Tensor:
    """transformers' dequantization of a block-quantized weight (partial edge blocks included)."""
    return _dequantize_fp8_weight(q, scale, list(block), torch.float32)


def save_tokenizer(path: Path) -> None:
    """A word-level tokenizer over :data:`WORDS` ("<s>" first, as a BOS), ids < the tiny vocab."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    vocab = {"[UNK]": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.add_special_tokens(["<s>"])
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(path / "tokenizer.json"))


@dataclass
class FP8Case:
    model_type: str
    path: str  # the FP8 checkpoint
    dequantized_path: str  # the same model with every weight written out as its real (fp32) value
    prompts: dict[str, torch.Tensor]
    logits: dict[str, torch.Tensor]  # transformers, fp32, on the dequantized weights
    quantized: tuple[str, ...]  # names of the FP8 weights


def make_fp8_case(model_type: str, root: Path) -> FP8Case:
    m = hf_tiny.model(model_type, **WIDTHS)
    plain, fp8_dir, deq_dir = root / f"{model_type}-plain", root / f"{model_type}-fp8", root / f"{model_type}-deq"
    m.save_pretrained(plain)
    stored, real, names = {}, {}, []
    for name, t in load_file(str(plain / "model.safetensors")).items():
        if quantized(name, t.shape):
            q, s = quantize(t)
            stored[name], stored[name + "_scale_inv"] = q, s
            real[name] = dequantize(q, s)
            names.append(name)
        else:
            stored[name] = t.to(torch.bfloat16)
            real[name] = stored[name].float()
    cfg = json.loads((plain / "config.json").read_text())
    cfg.pop("dtype", None)
    for d, tensors, extra in ((fp8_dir, stored, {"torch_dtype": "bfloat16", "quantization_config": {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)}}),
                              (deq_dir, real, {"torch_dtype": "float32"})):
        d.mkdir()
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / "model.safetensors"),
                  metadata={"format": "pt"})
        (d / "config.json").write_text(json.dumps({**cfg, **extra}, indent=1))
    save_tokenizer(fp8_dir)
    ref = AutoModelForCausalLM.from_pretrained(deq_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    prompts = {name: torch.randint(0, hf_tiny.VOCAB, (n,), generator=g) for name, n in hf_tiny.PROMPTS.items()}
    with torch.no_grad():
        logits = {name: ref(ids[None]).logits[0] for name, ids in prompts.items()}
    return FP8Case(model_type, str(fp8_dir), str(deq_dir), prompts, logits, tuple(names))
