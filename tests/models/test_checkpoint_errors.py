"""Model directories vpp refuses, each in one line naming the file and the key or tensor, found from
metadata alone (config.json, the index, safetensors headers) by ``check_model_dir`` -- what the CLI
runs before starting ranks -- and, for the tensors a rank reads, by the rank's own loader.

Quantization: other methods, formats and schemes (config); int8 weights with weight_scale /
weight_offset (Ascend W8A8); integer weights; a float8 weight without its scale; a scale of the
wrong shape; scales without a quantization_config. Files: malformed config.json, a truncated or
garbage safetensors file, an index that is not JSON, points outside the directory or names a
missing shard, a tensor whose shape is not the config's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vpp.config import ConfigError
from vpp.models import CheckpointError, check_model_dir, load_stage
from vpp.parallel import ParallelGroups

SINGLE = ParallelGroups.single()
WEIGHT = "model.layers.1.mlp.experts.2.up_proj.weight"  # FP8 [40, 72], scales [2, 3]


def _variant(src: str, dst: Path, *, tensors=None, config=None) -> Path:
    """A copy of the model directory ``src`` with its tensors and/or config rewritten."""
    shutil.copytree(src, dst)
    if tensors is not None:
        new = tensors(load_file(str(dst / "model.safetensors")))
        save_file({k: v.contiguous() for k, v in new.items()}, str(dst / "model.safetensors"))
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps(config(cfg)))
    return dst


def _refused(path: Path, error: type, pattern: str, names: str) -> str:
    """check_model_dir refuses ``path`` with one line matching ``pattern`` that names ``names``."""
    with pytest.raises(error, match=pattern) as info:
        check_model_dir(path)
    message = str(info.value)
    assert "\n" not in message and names in message, message
    return message


@pytest.fixture
def fp8_dir(fp8_cases):
    return fp8_cases["deepseek_v3"].path


@pytest.mark.parametrize("method", ["awq", "gptq", "compressed-tensors", "bitsandbytes", None])
def test_other_quantization_methods_are_refused_by_the_config_reader(method, fp8_dir, tmp_path):
    bad = _variant(fp8_dir, tmp_path / "m", config=lambda c: {**c, "quantization_config": {
        "quant_method": method, "bits": 4}})
    message = _refused(bad, ConfigError, rf"quantization_config.quant_method={method!r} is not supported; "
                                         r"supported: quant_method 'fp8' with fmt 'e4m3'", str(bad / "config.json"))
    assert "weight_block_size" in message


@pytest.mark.parametrize("change,pattern", [
    ({"fmt": "e5m2"}, r"quantization_config.fmt='e5m2' is not supported"),
    ({"activation_scheme": "static"}, r"activation_scheme='static' \(static activation scales\) is not supported"),
    ({"weight_block_size": None}, r"weight_block_size=None is not two positive integers \(per-tensor"),
    ({"weight_block_size": [128]}, r"weight_block_size=\[128\] is not two positive integers"),
])
def test_other_fp8_variants_are_refused_by_the_config_reader(change, pattern, fp8_dir, tmp_path):
    bad = _variant(fp8_dir, tmp_path / "m", config=lambda c: {
        **c, "quantization_config": {**c["quantization_config"], **change}})
    _refused(bad, ConfigError, pattern, str(bad / "config.json"))
    with pytest.raises(ConfigError, match=pattern):  # a rank refuses the same way
        load_stage(bad, (0, 1), SINGLE)


def test_ascend_w8a8_is_refused(fp8_dir, tmp_path):
    def w8a8(t):
        t = {k: v for k, v in t.items() if not k.endswith("_scale_inv")}
        for name in [k for k in t if k.endswith("proj.weight") and ".layers." in k and "gate.weight" not in k]:
            t[name] = torch.randint(-127, 128, t[name].shape, dtype=torch.int8)
            t[name + "_scale"], t[name + "_offset"] = torch.ones(t[name].shape[0], 1), torch.zeros(t[name].shape[0], 1)
        return t
    bad = _variant(fp8_dir, tmp_path / "m", tensors=w8a8, config=lambda c: {
        k: v for k, v in c.items() if k != "quantization_config"})
    message = _refused(bad, CheckpointError, r"weight_scale/weight_offset tensors\): int8 weights with per-channel "
                                             r"scales and offsets \(the Ascend W8A8 layout\) are not supported; "
                                             r"supported: bf16/fp16/fp32 weights, or FP8",
                       str(bad / "model.safetensors"))
    assert ".weight_offset" in message or ".weight_scale" in message
    with pytest.raises(CheckpointError, match="Ascend W8A8"):
        load_stage(bad, (0, 1), SINGLE)


def test_integer_weights_are_refused(fp8_dir, tmp_path):
    def int8(t):
        del t[WEIGHT + "_scale_inv"]
        t[WEIGHT] = torch.zeros(t[WEIGHT].shape, dtype=torch.int8)
        return t
    bad = _variant(fp8_dir, tmp_path / "m", tensors=int8)
    _refused(bad, CheckpointError, rf"{WEIGHT} has dtype I8: integer-quantized weights are not supported",
             str(bad / "model.safetensors"))


def test_fp8_weight_without_scale_is_refused_not_loaded_unscaled(fp8_dir, tmp_path):
    bad = _variant(fp8_dir, tmp_path / "m", tensors=lambda t: {k: v for k, v in t.items()
                                                               if k != WEIGHT + "_scale_inv"})
    pattern = rf"{WEIGHT} is F8_E4M3 without {WEIGHT}_scale_inv \(its block scales\): loaded unscaled"
    _refused(bad, CheckpointError, pattern, str(bad / "model.safetensors"))
    with pytest.raises(CheckpointError, match=pattern):  # the rank that reads it refuses the same way
        load_stage(bad, (0, 2), SINGLE)
    load_stage(bad, (2, 4), SINGLE)  # another stage never reads it


def test_scale_of_the_wrong_shape_is_refused(fp8_dir, tmp_path):
    def wrong(t):
        t[WEIGHT + "_scale_inv"] = torch.ones(2, 2)  # [40, 72] in [24, 32] blocks needs [2, 3]
        return t
    bad = _variant(fp8_dir, tmp_path / "m", tensors=wrong)
    _refused(bad, CheckpointError, rf"{WEIGHT}_scale_inv is F32 \[2, 2\], but {WEIGHT} \[40, 72\] with "
                                   r"weight_block_size \[24, 32\] needs a float \[2, 3\]", str(bad / "model.safetensors"))
    other_block = _variant(fp8_dir, tmp_path / "b", config=lambda c: {
        **c, "quantization_config": {**c["quantization_config"], "weight_block_size": [32, 24]}})
    _refused(other_block, CheckpointError, r"with weight_block_size \[32, 24\] needs a float", "_scale_inv")


def test_scales_without_a_quantization_config_are_refused(fp8_dir, tmp_path):
    bad = _variant(fp8_dir, tmp_path / "m", config=lambda c: {k: v for k, v in c.items() if k != "quantization_config"})
    _refused(bad, CheckpointError, r"_scale_inv is a block scale, but .*config.json has no quantization_config",
             str(bad / "model.safetensors"))


def test_a_config_error_names_the_file_and_key(fp8_dir, tmp_path):
    bad = _variant(fp8_dir, tmp_path / "m", config=lambda c: {k: v for k, v in c.items() if k != "hidden_size"})
    _refused(bad, ConfigError, r"needs 'hidden_size' \(they fix tensor shapes and have no default\)",
             str(bad / "config.json"))
    (bad / "config.json").write_text('{"model_type": "deepseek_v3",\n "hidden_size": 72,, }')
    _refused(bad, ConfigError, r"not valid JSON: .* line 2 column 20", str(bad / "config.json"))
    (bad / "config.json").write_text('"deepseek_v3"')
    _refused(bad, ConfigError, r"holds a JSON str, not an object of config keys", str(bad / "config.json"))


def test_truncated_and_garbage_safetensors_are_named(fp8_dir, tmp_path):
    cut = _variant(fp8_dir, tmp_path / "cut")
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) - 1000])
    _refused(cut, CheckpointError, r"truncated: its header declares \d+ bytes of tensor data, the file holds \d+",
             str(cut / "model.safetensors"))
    (cut / "model.safetensors").write_bytes(data[:5000])  # inside the header
    _refused(cut, CheckpointError, r"not a safetensors file, or truncated: it declares a \d+-byte header but holds "
                                   r"5000 bytes", str(cut / "model.safetensors"))
    (cut / "model.safetensors").write_bytes(b"<html>rate limited</html>" * 40)
    _refused(cut, CheckpointError, r"not a safetensors file", str(cut / "model.safetensors"))
    n = 24
    (cut / "model.safetensors").write_bytes(n.to_bytes(8, "little") + b"{not json at all, no!!!}" + b"\0" * 64)
    _refused(cut, CheckpointError, r"its header is not JSON", str(cut / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"not a safetensors file: its header is not JSON"):
        load_stage(cut, (0, 1), SINGLE)


def _sharded(src: str, dst: Path, edit_map=None) -> Path:
    """``src`` re-saved as two shards with an index; ``edit_map`` rewrites the index's weight_map."""
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    (dst / "model.safetensors").unlink()
    names = sorted(tensors)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, part in parts.items():
        save_file({n: tensors[n].contiguous() for n in part}, str(dst / file))
        weight_map.update({n: file for n in part})
    if edit_map is not None:
        weight_map = edit_map(weight_map)
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def test_index_problems_are_refused(fp8_cases, fp8_dir, tmp_path):
    good = _sharded(fp8_dir, tmp_path / "good")
    check_model_dir(good)  # a weight and its scale may sit in different shards
    torch.testing.assert_close(load_stage(good, (0, 4), SINGLE, dtype=torch.float32)(fp8_cases["deepseek_v3"].prompts["a"],
                                                                                       "a", 0),
                               fp8_cases["deepseek_v3"].logits["a"], atol=1e-4, rtol=1e-4)
    index = "model.safetensors.index.json"
    for target in ("../elsewhere/model.safetensors", "/etc/model.safetensors", "sub/../../x.safetensors"):
        bad = _sharded(fp8_dir, tmp_path / f"out{len(target)}", lambda m: {**m, WEIGHT: target})
        _refused(bad, CheckpointError, rf"weight_map\['{WEIGHT}'\] = '{target}' points outside the model directory",
                 str(bad / index))
    missing = _sharded(fp8_dir, tmp_path / "missing")
    (missing / "model-00002-of-00002.safetensors").unlink()
    _refused(missing, CheckpointError, r"names the shard model-00002-of-00002.safetensors \(for \d+ tensors, e.g. .*\) "
                                       r"but .* does not exist", str(missing / index))
    (missing / index).write_text('{"weight_map": {"a": "b",}}')
    _refused(missing, CheckpointError, r"not valid JSON: .* line 1 column 26", str(missing / index))
    (missing / index).write_text('{"metadata": {}}')
    _refused(missing, CheckpointError, r'has no "weight_map" object', str(missing / index))
    misplaced = _sharded(fp8_dir, tmp_path / "misplaced", lambda m: {**m, WEIGHT: "model-00002-of-00002.safetensors"
                                                                     if m[WEIGHT].startswith("model-00001")
                                                                     else "model-00001-of-00002.safetensors"})
    _refused(misplaced, CheckpointError, rf"does not hold {WEIGHT}, which the index places there", "misplaced")


def test_a_tensor_of_another_shape_is_named(fp8_dir, tmp_path):
    name = "model.layers.2.self_attn.kv_a_layernorm.weight"

    def wider(t):
        t[name] = torch.ones(17, dtype=torch.bfloat16)
        return t
    bad = _variant(fp8_dir, tmp_path / "m", tensors=wider)
    _refused(bad, CheckpointError, rf"{name} has shape \[17\], the config describes \[16\]", str(bad / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"{name} has shape \[17\], the config describes \[16\]"):
        load_stage(bad, (2, 3), SINGLE)


def test_missing_and_unexpected_tensors_name_the_directory(fp8_dir, tmp_path):
    bad = _variant(fp8_dir, tmp_path / "m", tensors=lambda t: {k: v for k, v in t.items() if ".layers.3.mlp.gate." not in k})
    _refused(bad, CheckpointError, r"checkpoint does not match deepseek_v3 layers \[0, 4\): 2 tensors "
                                   r"\(model.layers.3.mlp.gate.e_score_correction_bias, model.layers.3.mlp.gate.weight\) "
                                   r"missing", str(bad))


def test_save_checkpoint_refuses_a_file_and_a_sharded_directory(tmp_path):
    """A path that is a file was a FileExistsError; a directory holding another checkpoint's index got
    a model.safetensors beside it, and loaders kept reading the old shards through the index, silently."""
    from vpp.models import model_config, random_checkpoint, save_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    cfg = model_config(TINY_CONFIGS["tiny-qwen"])
    weights = random_checkpoint(cfg, seed=0)
    a_file = tmp_path / "a-file"
    a_file.write_text("keep")
    with pytest.raises(ValueError, match=r"a-file: not a directory \(config.json and model.safetensors are written"):
        save_checkpoint(cfg, weights, a_file)
    assert a_file.read_text() == "keep"
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(ValueError, match=r"sharded: holds model.safetensors.index.json of another checkpoint"):
        save_checkpoint(cfg, weights, sharded)
    assert sorted(p.name for p in sharded.iterdir()) == ["model.safetensors.index.json"]
    failing = tmp_path / "new"

    def broken(name):
        raise RuntimeError("no weights")
    with pytest.raises(RuntimeError, match="no weights"):
        save_checkpoint(cfg, broken, failing)
    assert not failing.exists()  # a failed save leaves no empty folder behind


def test_a_failed_config_write_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    """Saving over a checkpoint when config.json's write fails (a full disk at its fsync): the old
    weights and config stay a pair, byte for byte (the weights were renamed into place before the config
    was written, so new weights sat beside the old config)."""
    import errno
    import os
    from vpp import safe_write
    from vpp.models import model_config, random_checkpoint, save_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("tells the config's file by its /proc/self/fd link (Linux)")
    cfg = model_config(TINY_CONFIGS["tiny-qwen"])
    out = tmp_path / "ckpt"
    save_checkpoint(cfg, random_checkpoint(cfg, seed=0), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_fsync = os.fsync

    def fsync(fd):
        if ".config.json." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)
    monkeypatch.setattr(safe_write.os, "fsync", fsync)
    bigger = {**cfg, "rms_norm_eps": 1e-5}
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(bigger, random_checkpoint(cfg, seed=1), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temporary file left either
