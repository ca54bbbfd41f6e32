"""The outside reference: torch.distributed.pipelining's GPipe on vpp stage modules gives the same
logits as the unpipelined toy model, and leaves exactly the prompt in the KV caches (its shape
inference must not run a dummy chunk through the stage)."""

import pytest
import torch

from vpp.models.toy import ToyStage
from vpp.parallel import initialize_model_parallel
from vpp.runtime.gpipe import gpipe_prefill

pytestmark = pytest.mark.slow  # every test here starts processes


def _gpipe(rank, world):
    groups = initialize_model_parallel(1, world)
    bounds = [(0, 2), (2, 3), (3, 5)][:world] if world == 3 else [(0, 2), (2, 5)]
    stage = ToyStage(bounds[rank], 5, vocab_size=64)
    ids = torch.randint(0, 64, (48,), generator=torch.Generator().manual_seed(3))
    out = gpipe_prefill(stage, ids if rank == 0 else None, 16, 48, groups)
    return out, stage.cache_length(0)


def test_gpipe_reference_matches_the_unpipelined_model(worlds):
    ids = torch.randint(0, 64, (48,), generator=torch.Generator().manual_seed(3))
    ref = ToyStage((0, 5), 5, vocab_size=64)(ids, 0, 0, last_token_only=True)[-1]
    for world in (2, 3):
        results = worlds.run(world, _gpipe, timeout=60)
        assert [r[1] for r in results] == [48] * world
        assert all(r[0] is None for r in results[:-1])
        torch.testing.assert_close(results[-1][0], ref, atol=1e-5, rtol=1e-5)
