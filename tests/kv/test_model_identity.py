"""A model identity (digest of the config and the weights) travels with every KV save and export and is
checked on load: a base model's caches under its fine-tune (same shapes, other weights) are refused naming
both, another TP rank's export is refused, a manifest claiming 10**12 tokens is refused naming
manifest.json before anything is allocated. Ranks that loaded different checkpoints are refused naming
them (handshake) and nodes whose same --model path holds other checkpoints differ in their arguments'
digest. In-process, one rank (virtual TP ranks for the slices)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from vpp.cli.checks import loaded_identity
from vpp.kv.files import load_cache, save_cache
from vpp.models import build_stage, model_config, random_checkpoint, save_checkpoint
from vpp.models.safetensors_files import checkpoint_digest
from vpp.models.tiny import TINY_CONFIGS
from vpp.parallel import ParallelGroups
from vpp.parallel.grid import GridSizes
from vpp.runtime import Pipeline
from vpp.runtime.handshake import RankInfo, StageInfo, model_disagreement

SINGLE = ParallelGroups.single()
CONFIG = model_config(TINY_CONFIGS["tiny-qwen"])
LAYERS = CONFIG["num_hidden_layers"]


def _pipe(seed, groups=SINGLE):
    return Pipeline([build_stage(CONFIG, (0, LAYERS), groups, weights=random_checkpoint(CONFIG, seed))], groups)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    pipe = _pipe(0)
    pipe.prefill(torch.arange(16), 8, schedule="cpp")
    directory = tmp_path_factory.mktemp("kv") / "saved"
    save_cache(pipe, 0, str(directory))
    return pipe, directory


def test_a_base_models_caches_under_its_fine_tune_are_refused(base):
    pipe, directory = base
    assert json.loads((directory / "manifest.json").read_text())["model"]["digest"] == pipe.model[0]
    tuned = _pipe(1)  # same shapes, other weights
    with pytest.raises(ValueError, match=rf"manifest.json: the caches were saved under model random weights \(seed 0\) "
                                         rf"\(digest {pipe.model[0]}\), this pipeline runs random weights \(seed 1\) "
                                         rf"\(digest {tuned.model[0]}\)"):
        load_cache(tuned, 0, str(directory))
    assert tuned.stages[0].cache_length(0) == 0
    with pytest.raises(ValueError, match=r"the caches were exported by model random weights \(seed 0\)"):
        tuned.import_cache(0, pipe.export_cache(0))
    assert tuned.stages[0].cache_length(0) == 0
    assert load_cache(_pipe(0), 0, str(directory))["tokens"] == 16  # the same model loads


def test_a_manifest_claiming_10_12_tokens_is_refused_before_allocation(base, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(base[1], copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["tokens"] = 10**12
    for e in m["tensors"]:
        e["shape"][e["shape"].index(16)] = 10**12  # consistent with itself, not with the files
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=rf"{copy}/manifest.json: tokens=1000000000000 is more than the model's "
                                         rf"{CONFIG['max_position_embeddings']} positions"):
        load_cache(_pipe(0), 0, str(copy))


def test_another_tp_ranks_export_is_refused():
    sizes = GridSizes(2, tp=2, pp=1)
    ranks = [_pipe(0, ParallelGroups.virtual(sizes, r, device="cpu")) for r in (0, 1)]
    export = ranks[0].export_cache(0)  # no request yet: fill it with rank 0's slices by hand
    export.update({n: torch.zeros([4 if d is None else d for d in shape])
                   for n, (shape, _) in ranks[0].stages[0].cache_shapes().items()})
    with pytest.raises(ValueError, match=r"request 0: model.layers.0.self_attn.k was exported as slice \(dim, start, "
                                         r"end, full\) \(0, 0, 1, 2\), this rank holds \(0, 1, 2, 2\): another TP "
                                         r"rank's export"):
        ranks[1].import_cache(0, export)
    assert ranks[1].stages[0].cache_length(0) == 0
    with pytest.raises(TypeError, match="import_cache takes what Pipeline.export_cache returned"):
        ranks[1].import_cache(0, dict(export))


def _info(rank, model):
    stage = StageInfo((0, 1), 8, 8, True, True, "float32", None, model)
    return RankInfo(rank, 0, 0, (stage,), None, None, None, "k")


def test_ranks_that_loaded_other_checkpoints_are_named():
    infos = [_info(0, ("a", "model")), _info(1, ("a", "model")), _info(2, ("b", "model"))]
    assert model_disagreement(infos) == ("ranks loaded different models: global rank(s) [0, 1] model (digest a) vs "
                                         "global rank(s) [2] model (digest b); give every rank the same checkpoint")
    assert model_disagreement(infos[:2]) is None


def test_nodes_compare_what_a_model_path_holds(tmp_path, monkeypatch):
    """Two nodes' ``--model model`` (the same relative path) holding other checkpoints of the same shapes:
    the arguments every rank compares (launch(same=...)) differ; the same checkpoint elsewhere agrees."""
    cfg = TINY_CONFIGS["tiny-qwen"]
    for node, seed in (("a", 0), ("b", 1), ("c", 0)):
        save_checkpoint(cfg, random_checkpoint(cfg, seed), tmp_path / node / "model")
    given = {}
    for node in "abc":
        monkeypatch.chdir(tmp_path / node)
        given[node] = loaded_identity(type("Args", (), {"model": "model"})())["--model"]
    assert given["a"] != given["b"] and given["a"] == given["c"]
    assert given["a"] == f"model (checkpoint digest {checkpoint_digest(tmp_path / 'a' / 'model')})"
