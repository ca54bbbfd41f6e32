"""The public API at CP2 (one stage, two context-parallel ranks): ``Pipeline.generate`` prefills in
chunks (the last one ragged, taken by pass-Q under auto) and decodes over the sharded caches; its
greedy tokens equal one rank's. tiny-glm: DSA past its index_topk of 256 keys, shared indexers."""

from __future__ import annotations

import pytest
import torch


def _worker(rank, world):
    from vpp.models.registry import open_model
    from vpp.parallel import ParallelGroups, initialize_model_parallel
    from vpp.runtime.pipeline import Pipeline
    groups = initialize_model_parallel(1, context_parallel_size=2)
    model = open_model("tiny-glm")
    stage = model.build((0, model.num_layers), groups)
    ids = torch.randint(0, 1000, (300,), generator=torch.Generator().manual_seed(0))
    tokens = Pipeline([stage], groups).generate(ids, 4, 128, schedule="cpp", release=False).tokens[0]
    ref = model.build((0, model.num_layers), ParallelGroups.single())
    one = [int(ref(ids, "r", 0, last_token_only=True).argmax())]
    for _ in range(3):
        one.append(int(ref.decode(torch.tensor(one[-1:]), ["r"]).argmax()))
    return tokens, one, [t[3] for t in stage.cp_trace], stage._caches()[0].length(0)


@pytest.mark.slow
def test_pipeline_generate_at_cp2_equals_one_rank():
    from vpp.parallel import run_distributed
    results = run_distributed(_worker, 2, timeout=600)
    for tokens, one, methods, rows in results:
        assert tokens == one
        assert methods == ["pass-kv", "pass-kv", "pass-q"]  # 44 new of 300 < tiny-glm's latent / query ratio
    assert sorted(r[3] for r in results) == [151, 152]  # 300 + 3 decoded tokens cached, each rank its share


def test_stages_that_cannot_split_over_the_pipelines_cp_group_are_refused():
    from types import SimpleNamespace

    from vpp.parallel.groups import Group
    from vpp.runtime.stage_contract import check_context_parallel
    check_context_parallel([object()], (0,))  # no context parallelism: nothing asked of the stages
    with pytest.raises(TypeError, match=r"lacks cp_group: context parallelism"):
        check_context_parallel([SimpleNamespace()], (0, 1))
    with pytest.raises(ValueError, match=r"splits its chunks over CP ranks \[0\], but the pipeline's CP group is \[0, 1\]"):
        check_context_parallel([SimpleNamespace(cp_group=Group.single(0))], (0, 1))
