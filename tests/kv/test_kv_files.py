"""``save_cache`` / ``load_cache`` on one process (tiny-qwen, random weights): what a directory may be,
what a damaged one says, and that a refusal changes nothing. The round trip across layouts and TP
sizes, with parity against transformers, is tests/kv/test_handover.py's (slow)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from vpp.models import build_stage, model_config, random_checkpoint
from vpp.models.tiny import TINY_CONFIGS
from vpp.parallel import ParallelGroups
from vpp.runtime import Pipeline
from vpp.kv.files import load_cache, save_cache

SINGLE = ParallelGroups.single()
CONFIG = model_config(TINY_CONFIGS["tiny-qwen"])
LAYERS = CONFIG["num_hidden_layers"]


@pytest.fixture(scope="module")
def weights():
    return random_checkpoint(CONFIG, seed=0)


def _pipe(weights, ranges=((0, LAYERS),)):
    return Pipeline([build_stage(CONFIG, r, SINGLE, weights=weights) for r in ranges], SINGLE)


@pytest.fixture(scope="module")
def saved(weights, tmp_path_factory):
    """A directory holding request 0's caches after a 32-token prefill, and that pipeline."""
    pipe = _pipe(weights)
    pipe.prefill(torch.randint(0, CONFIG["vocab_size"], (32,), generator=torch.Generator().manual_seed(0)), 8,
                 schedule="cpp")
    directory = tmp_path_factory.mktemp("kv") / "saved"
    save_cache(pipe, 0, str(directory))
    return pipe, directory


def test_saving_over_saved_caches_is_refused_and_they_stay_readable(saved, weights):
    """Before: the rank files were replaced one by one under the old manifest, so a save failing half-way
    left the old manifest over new files (read as the old request when the shapes agreed)."""
    pipe, directory = saved
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    with pytest.raises(ValueError, match=r"saved: already holds saved caches \(manifest.json\); choose an empty "
                                         r"directory"):
        save_cache(pipe, 0, str(directory))
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before
    other = _pipe(weights, ((0, 2), (2, LAYERS)))  # another layout reads it
    assert load_cache(other, 0, str(directory))["tokens"] == 32
    torch.testing.assert_close(other.decode(torch.tensor([3]), [0]), pipe.decode(torch.tensor([3]), [0]))
    pipe.release(0)
    pipe.prefill(torch.randint(0, CONFIG["vocab_size"], (32,), generator=torch.Generator().manual_seed(0)), 8,
                 schedule="cpp")  # back as the fixture left it


def test_saving_to_a_file_is_refused(saved, tmp_path):
    pipe, _ = saved
    target = tmp_path / "a-file"
    target.write_text("keep")
    with pytest.raises(ValueError, match=r"a-file: not a directory \(save_cache writes a directory of files\)"):
        save_cache(pipe, 0, str(target))  # was FileExistsError, after the ranks' exchange
    assert target.read_text() == "keep"


def _damaged(saved, tmp_path, damage):
    copy = tmp_path / "copy"
    shutil.copytree(saved[1], copy)
    damage(copy)
    return str(copy)


def _cut(copy):
    f = copy / "rank-00000.safetensors"
    f.write_bytes(f.read_bytes()[:200])


def _drop_tensors(copy):
    m = json.loads((copy / "manifest.json").read_text())
    del m["tensors"]
    (copy / "manifest.json").write_text(json.dumps(m))


def _escape(copy):
    m = json.loads((copy / "manifest.json").read_text())
    m["tensors"][0]["file"] = "../elsewhere.safetensors"
    (copy / "manifest.json").write_text(json.dumps(m))


def _edit(copy, **fields):
    m = json.loads((copy / "manifest.json").read_text())
    m["tensors"][0].update(fields)
    (copy / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("damage, message", [
    (_cut, r"copy/rank-00000.safetensors: cannot read 'model.layers.0.self_attn.k.*' of the saved caches "
           r"\(SafetensorError: "),                           # was a bare SafetensorError naming no file
    (lambda c: (c / "rank-00000.safetensors").unlink(), r"rank-00000.safetensors: cannot read .*FileNotFoundError"),
    (_drop_tensors, r"manifest.json: 'tensors' must be a non-empty list of stored slices, got None"),  # KeyError
    (_escape, r"manifest.json: tensors\[0\] names file '../elsewhere.safetensors' outside the directory"),
    (lambda c: _edit(c, start="0"), r"manifest.json: tensors\[0\] holds a malformed field: dim=0, start='0', end=2, "
                                    r"full=2"),  # was a bare TypeError from the plan
    (lambda c: _edit(c, end=3), r"manifest.json: tensors\[0\] \(model.layers.0.self_attn.k\) holds slice \[0, 3\) of 2 "
                                r"along dim 0: empty or out of range"),  # was a ValueError naming no file
])
def test_a_damaged_directory_is_named_and_installs_nothing(saved, weights, tmp_path, damage, message):
    other = _pipe(weights)
    with pytest.raises(ValueError, match=message):
        load_cache(other, 0, _damaged(saved, tmp_path, damage))
    assert other.stages[0].cache_length(0) == 0


def test_loading_over_a_live_request_is_refused_before_reading(saved, weights):
    """Before: the first stage took the caches, the second refused: half a request was left installed."""
    pipe, directory = saved
    other = _pipe(weights, ((0, 2), (2, LAYERS)))
    other.stages[1].reserve(0, 4)
    other.stages[1](torch.zeros(4, CONFIG["hidden_size"]), 0, 0)  # request 0 holds 4 tokens on stage [2, 6)
    with pytest.raises(ValueError, match=r"request 0 already holds 4 tokens on stage \[2, 6\]: release it before "
                                         r"loading its caches"):
        load_cache(other, 0, str(directory))
    assert other.stages[0].cache_length(0) == 0


def test_caches_of_another_model_are_named(saved):
    cfg = model_config(TINY_CONFIGS["tiny-deepseek"])
    pipe = Pipeline([build_stage(cfg, (0, cfg["num_hidden_layers"]), SINGLE, weights=random_checkpoint(cfg))],
                    SINGLE)
    with pytest.raises(ValueError, match=r"saved: the saved caches \(written by a pipeline of .*\) do not cover this "
                                         r"rank's stages: rank 0 needs model.layers.0.self_attn.latent"):
        load_cache(pipe, 0, str(saved[1]))


def _other(**overrides):
    """A pipeline of tiny-qwen with ``overrides`` in its config (another model of the same family);
    ``dtype`` builds it in that dtype."""
    dtype = overrides.pop("dtype", torch.float32)
    cfg = model_config({**TINY_CONFIGS["tiny-qwen"], **overrides})
    stage = build_stage(cfg, (0, cfg["num_hidden_layers"]), SINGLE, weights=random_checkpoint(cfg), dtype=dtype)
    return Pipeline([stage], SINGLE)


@pytest.mark.parametrize("overrides, message", [
    # before: each loaded without a word; fewer layers then decoded garbage, the others failed in the
    # attention with a bare RuntimeError (or decoded garbage when the widths happened to fit)
    (dict(num_hidden_layers=LAYERS - 2), rf"saved/manifest.json: the saved caches are of a {LAYERS}-layer model, "
                                         rf"this pipeline's model has {LAYERS - 2} layers"),
    (dict(head_dim=32), r"saved/manifest.json: model.layers.0.self_attn.k is \[2, 32, 64\] float32, but its caches "
                        r"here are \[any, tokens, 32\] float32"),
    (dict(dtype=torch.bfloat16), r"model.layers.0.self_attn.k is \[2, 32, 64\] float32, but its caches here are "
                                 r"\[any, tokens, 64\] bfloat16"),
])
def test_caches_of_another_model_of_the_family_are_refused(saved, overrides, message):
    other = _other(**overrides)
    with pytest.raises(ValueError, match=message):
        load_cache(other, 0, str(saved[1]))
    assert other.stages[0].cache_length(0) == 0


def test_a_file_of_another_save_is_refused(saved, weights, tmp_path):
    """Before: a rank file of another save with the same shapes (another prompt of as many tokens) loaded
    that prompt's caches under this manifest, without a word."""
    pipe, _ = saved
    ids = torch.randint(0, CONFIG["vocab_size"], (32,), generator=torch.Generator().manual_seed(1))
    pipe.prefill(ids, 8, schedule="cpp", request_ids=[4])
    save_cache(pipe, 4, str(tmp_path / "another"))
    pipe.release(4)
    copy = _damaged(saved, tmp_path, lambda c: shutil.copy(tmp_path / "another" / "rank-00000.safetensors", c))
    other = _pipe(weights)
    with pytest.raises(ValueError, match=r"copy/rank-00000.safetensors: cannot read .* \(ValueError: the file belongs "
                                         r"to save '[0-9a-f]{16}', the manifest to '[0-9a-f]{16}'\)"):
        load_cache(other, 0, copy)
    assert other.stages[0].cache_length(0) == 0


def _flip(copy):
    """Flip bits in the last stored tensor's bytes (the header, shapes and length stay valid)."""
    f = copy / "rank-00000.safetensors"
    data = bytearray(f.read_bytes())
    for i in range(len(data) - 256, len(data), 4):
        data[i] ^= 0x40
    f.write_bytes(bytes(data))


def test_a_corrupted_file_is_refused(saved, weights, tmp_path):
    """Before: flipped bytes inside a stored tensor loaded as caches and decoded garbage."""
    other = _pipe(weights, ((0, 2), (2, LAYERS)))
    with pytest.raises(ValueError, match=rf"copy/rank-00000.safetensors: cannot read 'model.layers.{LAYERS - 1}"
                                         r"\.self_attn\.v\[0:2\]' of the saved caches \(ValueError: checksum "
                                         r"0x[0-9a-f]{8}, the manifest says 0x[0-9a-f]{8}: the file is corrupted\)"):
        load_cache(other, 0, _damaged(saved, tmp_path, _flip))
    assert [st.cache_length(0) for st in other.stages] == [0, 0]


def test_imported_caches_of_another_model_are_refused(saved):
    """Pipeline.import_cache of another model's tensors (other widths, other dtype): before, installed,
    then a bare RuntimeError in the attention."""
    pipe, _ = saved
    moved = pipe.export_cache(0)
    for overrides in (dict(head_dim=32), dict(dtype=torch.bfloat16)):
        other = _other(**overrides)
        with pytest.raises(ValueError, match=rf"stage \(0, {LAYERS}\): KV hand-over for request 0: "
                                             r"model.layers.0.self_attn.k is \[2, 32, 64\] float32, but its caches"):
            other.import_cache(0, moved)
        assert other.stages[0].cache_length(0) == 0
