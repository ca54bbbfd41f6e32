"""Each tensor-parallel layer equals its dense torch reference at TP = 1, 2 and 4 (CPU, gloo, fp32).

Tolerance: a sharded layer computes the same dot products, but a row-parallel layer and the
all-reduce sum partial products in a different order. In fp32 (eps 1.2e-7) with O(1) inputs and
reduction lengths <= 96, the reordering error is a few ulps of values of size ~10, so
``atol=1e-5, rtol=1e-5`` is ~10x the expected error and ~1e5x below any real sharding bug (a wrong
slice changes values by O(1)).
"""

import pytest
import torch
import torch.nn.functional as F

from vpp.parallel import (
    ColumnParallelLinear, ParallelLMHead, RowParallelLinear, VocabParallelEmbedding,
    initialize_model_parallel, load_state,
)
from vpp.parallel.groups import Group

TOL = dict(atol=1e-5, rtol=1e-5)


def _full(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def _check_layers(rank, world_size):
    groups = initialize_model_parallel(tensor_model_parallel_size=world_size)
    tp = groups.tp
    x = _full(1, 3, 5, 32)  # identical on every rank
    w, b = _full(2, 48, 32), _full(3, 48)

    col = ColumnParallelLinear(32, 48, tp, bias=True, gather_output=True)
    load_state(col, {"weight": w, "bias": b}.__getitem__)
    torch.testing.assert_close(col(x), F.linear(x, w, b), **TOL)

    col_local = ColumnParallelLinear(32, 48, tp, bias=True, gather_output=False)
    load_state(col_local, {"weight": w, "bias": b}.__getitem__)
    torch.testing.assert_close(col_local(x), F.linear(x, w, b).chunk(tp.size, -1)[tp.rank], **TOL)

    w2, b2 = _full(4, 24, 48), _full(5, 24)
    row = RowParallelLinear(48, 24, tp, bias=True, input_is_parallel=True)
    load_state(row, {"weight": w2, "bias": b2}.__getitem__)
    # the classic MLP pairing: column (no gather) -> row (parallel input)
    torch.testing.assert_close(row(col_local(x)), F.linear(F.linear(x, w, b), w2, b2), **TOL)

    row_full = RowParallelLinear(48, 24, tp, bias=True, input_is_parallel=False)
    load_state(row_full, {"weight": w2, "bias": b2}.__getitem__)
    h = _full(6, 7, 48)
    torch.testing.assert_close(row_full(h), F.linear(h, w2, b2), **TOL)

    for vocab in (40, 37):  # 37 does not divide by 2 or 4: padded rows
        emb_w = _full(7, vocab, 16)
        ids = torch.tensor([[0, 1, vocab - 1, 17], [5, vocab // 2, 3, vocab - 2]])
        emb = VocabParallelEmbedding(vocab, 16, tp)
        load_state(emb, {"weight": emb_w}.__getitem__)
        torch.testing.assert_close(emb(ids), F.embedding(ids, emb_w), **TOL)

        head = ParallelLMHead(16, vocab, tp)
        load_state(head, {"weight": emb_w}.__getitem__)
        hidden = _full(8, 2, 3, 16)
        ref = F.linear(hidden, emb_w)
        torch.testing.assert_close(head(hidden), ref, **TOL)
        assert torch.equal(head.argmax(hidden), ref.argmax(-1))

    if tp.size > 1:
        with pytest.raises(ValueError, match=f"out_features=45 .* not divisible by {tp.size} ranks"):
            ColumnParallelLinear(32, 45, tp)
        with pytest.raises(ValueError, match=f"in_features=45 .* not divisible by {tp.size} ranks"):
            RowParallelLinear(45, 8, tp)
    return tp.size


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_layers_match_dense_reference(tp, worlds):
    assert worlds.run(tp, _check_layers, timeout=120) == [tp] * tp


def test_shape_errors_carry_the_numbers_without_a_process_group():
    group = Group(ranks=(0, 1, 2), rank=0)  # a 3-member group described, never used to communicate
    with pytest.raises(ValueError, match="out_features=64 is not divisible by 3 ranks"):
        ColumnParallelLinear(16, 64, group)
    head = ParallelLMHead(16, 64, group)  # vocab dims are padded instead
    assert head.weight.shape == (22, 16) and (head.vocab_start, head.vocab_end) == (0, 22)
