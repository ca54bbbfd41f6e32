"""``vpp prefill --cached-prefix 64`` on every family's tiny transformers checkpoint, at PP 2 and
TP 2 x PP 2: the first 64 of 200 tokens are prefilled untimed, the remaining 136 in chunks of 48 on
VPP-Async with the prefix's caches in place; the saved last-token logits equal transformers' own
forward of all 200 tokens (float32; relative error < 1e-4 of the largest logit: the two compute the
same sums in another order, ~1e-6 relative). GLM-5's 4-layer tiny case shares indexers so that only
3 stages can start; an 8-layer one (IndexShare kept, every other layer shared) fills the V's 4."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.models import hf_tiny
from tests.models.hf_tiny import MODEL_TYPES


def _path(model_type, hf_cases, root):
    if model_type != "glm_moe_dsa":
        return hf_cases[model_type].path
    path = root / "glm8"
    hf_tiny.model(model_type, num_hidden_layers=8).save_pretrained(path)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("tp", (1, 2))
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_cached_prefix_logits_equal_transformers(model_type, tp, hf_cases, tmp_path):
    import transformers as tf
    path = _path(model_type, hf_cases, tmp_path)
    out = tmp_path / "logits.safetensors"
    proc = subprocess.run(
        [sys.executable, "-m", "vpp", "prefill", "--model", path, "--tp", str(tp), "--pp", "2",
         "--cached-prefix", "64", "--seq-len", "200", "--chunk-size", "48", "--schedule", "vpp-async",
         "--dtype", "float32", "--repeat", "1", "--no-warmup", "--no-progress", "--json", "--save-logits", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = load_file(str(out))
    ids = saved["input_ids"]
    assert ids.numel() == 200
    model = tf.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(ids[None]).logits[0, -1]
    got = saved["logits.vpp-async"].reshape(-1)
    rel = (got - ref).abs().max() / ref.abs().max()
    assert rel < 1e-4, f"{model_type} tp={tp}: relative error {rel:.3e}"
