"""``vpp prefill --cached-prefix 64`` on every family's tiny transformers checkpoint, at PP 2 and
TP 2 x PP 2: the first 64 of 200 tokens are prefilled untimed, the remaining 136 in chunks of 48 on
VPP-Async with the prefix's caches in place; the last-token logits equal transformers' own forward
of all 200 tokens (float32; relative error < 1e-4 of the largest logit: the two compute the same sums
in another order, ~1e-6 relative). GLM-5's 4-layer tiny case shares indexers so that only 3 stages
can start; an 8-layer one (IndexShare kept, every other layer shared) fills the V's 4.

Every family and TP run the command's engine (``run_bench``, what ``vpp prefill`` runs on each rank)
on the session's persistent worlds; the command itself, from its arguments to the saved logits file,
runs once, in this process on its own spawned ranks (the wiring is the same for every family)."""

import pytest
import torch
from safetensors.torch import load_file

from tests.models import hf_tiny
from tests.models.hf_tiny import MODEL_TYPES

SEQ, CACHED, CHUNK = 200, 64, 48


def _path(model_type, hf_cases, root):
    if model_type != "glm_moe_dsa":
        return hf_cases[model_type].path
    path = root / "glm8"
    if not path.exists():
        hf_tiny.model(model_type, num_hidden_layers=8).save_pretrained(path)
    return str(path)


def _reference(path, ids):
    import transformers as tf
    model = tf.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids[None]).logits[0, -1]


def _assert_close(got, ref, what):
    rel = (got.reshape(-1) - ref).abs().max() / ref.abs().max()
    assert rel < 1e-4, f"{what}: relative error {rel:.3e}"


def _engine(rank, world, path, tp):
    """What ``vpp prefill --tp {tp} --pp 2 --cached-prefix 64 ...`` runs on each rank."""
    from vpp.cli.prefill_rounds import BenchConfig, run_bench
    from vpp.parallel import initialize_model_parallel
    cfg = BenchConfig(model=path, tp=tp, pp=2, seq_len=SEQ, chunk_size=CHUNK, schedules=("vpp-async",), repeat=1,
                      warmup=False, dtype="float32", cached_prefix=CACHED, pin=False)
    _, facts = run_bench(initialize_model_parallel(tp, 2), cfg)
    return facts["prompt"], facts["logits"]["vpp-async"]


@pytest.mark.slow
@pytest.mark.parametrize("tp", (1, 2))
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_cached_prefix_logits_equal_transformers(model_type, tp, hf_cases, tmp_path_factory, worlds):
    path = _path(model_type, hf_cases, tmp_path_factory.getbasetemp())
    results = worlds.run(2 * tp, _engine, path, tp, timeout=600)
    ids, logits = results[0]
    assert ids.numel() == SEQ and all(torch.equal(r[1], logits) for r in results)  # every rank gathered the same
    _assert_close(logits, _reference(path, ids), f"{model_type} tp={tp}")


@pytest.mark.slow
def test_the_command_saves_the_cached_prefix_logits(hf_cases, tmp_path_factory, tmp_path, capsys):
    from vpp import cli
    path = _path("glm_moe_dsa", hf_cases, tmp_path_factory.getbasetemp())
    out = tmp_path / "logits.safetensors"
    assert cli.main(["prefill", "--model", path, "--tp", "2", "--pp", "2", "--cached-prefix", str(CACHED),
                     "--seq-len", str(SEQ), "--chunk-size", str(CHUNK), "--schedule", "vpp-async", "--dtype", "float32",
                     "--repeat", "1", "--no-warmup", "--no-progress", "--json", "--save-logits", str(out)]) == 0, \
        capsys.readouterr().err[-3000:]
    saved = load_file(str(out))
    ids = saved["input_ids"]
    assert ids.numel() == SEQ
    _assert_close(saved["logits.vpp-async"], _reference(path, ids), "vpp prefill --tp 2 --pp 2 on glm_moe_dsa")
