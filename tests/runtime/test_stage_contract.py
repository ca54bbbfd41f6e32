"""The stage contract (vpp.runtime.stage_contract) is checked at entry with one error naming every
missing member of every stage, and the stages a model author builds from their own layers
(vpp.runtime.layer_stages, the model of examples/own_model.py) follow it and match the model's own
unpipelined forward (one process here; two ranks in tests/cli/test_examples.py)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch

from vpp.models import build_stage, model_config, random_checkpoint
from vpp.models.tiny import TINY_CONFIGS
from vpp.models.toy import ToyStage
from vpp.parallel import ParallelGroups
from vpp.runtime import Pipeline, forward_dcpp_prefill, forward_prefill, make_layout
from vpp.runtime.layer_stages import KVCache, LayerStage, stages_from_module
from vpp.runtime.stage_contract import REQUIRED, StageModule, check_stages, missing_members

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _example():
    spec = importlib.util.spec_from_file_location("own_model", ROOT / "examples" / "own_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class HalfStage(torch.nn.Module):  # a call and a layer range: everything else is missing
    layer_range = (0, 1)

    def forward(self, x, request, offset):
        return x


class NotAModule:
    hidden_size = 8


def test_the_check_names_every_missing_member_at_once():
    with pytest.raises(TypeError) as err:
        check_stages([HalfStage(), NotAModule()])
    line = str(err.value)
    assert "\n" not in line
    assert ("stages[0] (HalfStage) lacks hidden_size, vocab_size, is_first, is_last, dtype, cache_length, release; "
            "stages[1] (NotAModule) lacks __call__, layer_range, vocab_size, is_first, is_last, dtype, cache_length, "
            "release: the stage contract") in line


@pytest.mark.parametrize("entry", ["Pipeline", "forward_prefill", "forward_dcpp_prefill"])
def test_every_entry_checks_the_contract_before_any_work(entry):
    ids = torch.zeros(8, dtype=torch.long)
    with pytest.raises(TypeError, match=r"stages\[0\] \(HalfStage\) lacks hidden_size, vocab_size, is_first, is_last, "
                                        r"dtype, cache_length, release"):
        if entry == "Pipeline":
            Pipeline([HalfStage()], ParallelGroups.single())
        elif entry == "forward_dcpp_prefill":
            forward_dcpp_prefill([HalfStage()], ids, 4, ParallelGroups.single())
        else:
            forward_prefill([HalfStage()], ids, 4, ParallelGroups.single(), schedule="cpp")


def test_the_stages_vpp_ships_follow_the_contract():
    config = model_config(TINY_CONFIGS["tiny-qwen"])
    real = build_stage(config, (0, 2), ParallelGroups.single(), weights=random_checkpoint(config, seed=0))
    model = _example().MyModel()
    own = stages_from_module(model, make_layout("loop", 4, 1), 0)[0]
    for stage in (real, ToyStage((0, 2), 2), own):
        assert missing_members(stage, REQUIRED) == [] and isinstance(stage, StageModule), type(stage)


def test_own_layers_match_their_unpipelined_forward_and_decode_the_same_tokens():
    example = _example()
    torch.manual_seed(0)
    model, ids = example.MyModel().eval(), torch.randint(0, 256, (90,))
    stages = stages_from_module(model, make_layout("v", 4, 1), 0)  # a V on one rank: 2 stages, local hand-over
    assert [s.layer_range for s in stages] == [(0, 2), (2, 4)]
    assert [n for n, _ in stages[1].named_parameters()][0].startswith("layers.2.")  # global block indices
    pipe = Pipeline(stages, ParallelGroups.single())
    out = pipe.prefill(ids, 32, schedule="vpp")
    assert out.logits.shape == (256,) and float((out.logits - model(ids)[-1]).abs().max()) < 1e-5
    assert stages[0].cache_length(0) == 90 and stages[0].cache_nbytes() == 2 * 2 * 90 * 64 * 4  # 2 blocks, K+V
    pipe.release(0)
    assert stages[0].requests() == [] and stages[0].cache_nbytes() == 0
    tokens = pipe.generate(ids, max_new_tokens=3, chunk_size=32, schedule="vpp").tokens[0]
    new = ids.tolist()
    for _ in range(3):
        new.append(int(model(torch.tensor(new))[-1].argmax()))
    assert tokens == new[-3:]


def test_a_chunk_at_the_wrong_offset_and_a_block_that_skips_its_cache_are_refused():
    stage = stages_from_module(_example().MyModel(), make_layout("loop", 4, 1), 0)[0]
    stage(torch.arange(5), 0, 0)
    with pytest.raises(ValueError, match=r"stage \(0, 4\): request 0 chunk at offset 3, but this stage has cached 5"):
        stage(torch.arange(2), 0, 3)

    class Forgets(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(8, 8)

        def forward(self, h, positions, kv):
            return self.w(h)

    lonely = LayerStage([Forgets()], (0, 1), 1, embed=torch.nn.Embedding(16, 8), norm=None,
                        head=torch.nn.Linear(8, 16), hidden_size=8, vocab_size=16)
    with pytest.raises(ValueError, match=r"after a chunk of 4 tokens every block should hold 4, but \(block, tokens\) "
                                         r"\[\(0, 0\)\]"):
        lonely(torch.arange(4), 7, 0)


def test_a_cache_manager_of_ones_own_replaces_the_default():
    made = []

    class Counting(KVCache):
        def __init__(self, n):
            super().__init__(n)
            made.append(self)

    stages = stages_from_module(_example().MyModel(), make_layout("v", 4, 1), 0, cache=Counting)
    stages[0](torch.arange(3), 0, 0)
    assert len(made) == 2 and made[0].length(0) == 3 and made[1].length(0) == 0


def test_a_module_without_the_named_parts_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"Linear has no attribute\(s\) layers, embed, norm, head"):
        stages_from_module(torch.nn.Linear(2, 2), make_layout("loop", 4, 1), 0)
