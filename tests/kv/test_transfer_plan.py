"""The KV hand-over plan: every slice a destination needs arrives exactly once, from a source that
holds it, spread over the sources; checked by counting units (heads, whole tensors) per destination."""

from __future__ import annotations

import pytest

from vpp.kv.transfer_plan import Holding, Piece, Transfer, bytes_per_rank, plan_transfers
from vpp.transformer.attention.cache import shape_problem


def kv_heads(tp: int, rank: int, heads: int) -> tuple[int, int]:
    """The KV heads TP rank ``rank`` holds (transcribed from the rule in gqa.kv_head_shard: an equal
    share, or one head replicated on tp / heads consecutive ranks)."""
    parts = min(heads, tp)
    index = rank * parts // tp
    return index * heads // parts, (index + 1) * heads // parts


def gqa_rank(first: int, tp: int, layers: range, heads: int) -> list[Holding]:
    """A pipeline rank's TP group of GQA layers: global ranks first .. first + tp - 1."""
    out = []
    for r in range(tp):
        lo, hi = kv_heads(tp, r, heads)
        out.append(Holding(first + r, tuple(Piece(f"model.layers.{i}.self_attn.{p}", 0, lo, hi, heads)
                                            for i in layers for p in ("k", "v"))))
    return out


def mla_rank(first: int, tp: int, layers: range, indexer=lambda i: True) -> list[Holding]:
    pieces = tuple(Piece.whole(f"model.layers.{i}.self_attn.{p}") for i in layers
                   for p in (("latent", "index_k") if indexer(i) else ("latent",)))
    return [Holding(first + r, pieces) for r in range(tp)]


def units_received(plan: list[Transfer]) -> dict:
    """(dst, name, unit) -> how many times it arrives."""
    got: dict = {}
    for t in plan:
        for u in range(t.start, t.end) if t.dim is not None else [None]:
            got[(t.dst, t.name, u)] = got.get((t.dst, t.name, u), 0) + 1
    return got


def units_needed(destinations: list[Holding]) -> set:
    return {(d.rank, p.name, u) for d in destinations for p in d.pieces
            for u in (range(p.start, p.end) if p.dim is not None else [None])}


def check_exact(sources, destinations, plan):
    got = units_received(plan)
    assert set(got) == units_needed(destinations)  # nothing missing, nothing extra
    assert set(got.values()) == {1}  # every unit once
    held = {(s.rank, p.name): p for s in sources for p in s.pieces}
    for t in plan:  # each transfer reads inside what its source holds and writes inside what its destination needs
        src = held[(t.src, t.name)]
        assert src.start <= t.start and t.end <= src.end and t.src_offset == t.start - src.start
        need = next(p for d in destinations if d.rank == t.dst for p in d.pieces if p.name == t.name)
        assert need.start <= t.start and t.end <= need.end and t.dst_offset == t.start - need.start


@pytest.mark.parametrize("heads", [1, 2, 4, 8])
@pytest.mark.parametrize("tp_p,pp_p,tp_d,pp_d", [(1, 2, 2, 1), (2, 2, 4, 1), (4, 1, 2, 2), (2, 1, 1, 3),
                                                 (1, 1, 8, 1), (8, 2, 1, 1)])
def test_gqa_every_head_once(heads, tp_p, pp_p, tp_d, pp_d):
    layers = 6
    split = lambda pp: [range(p * layers // pp, (p + 1) * layers // pp) for p in range(pp)]  # noqa: E731
    src = [h for p, ls in enumerate(split(pp_p)) for h in gqa_rank(p * tp_p, tp_p, ls, heads)]
    base = tp_p * pp_p
    dst = [h for p, ls in enumerate(split(pp_d)) for h in gqa_rank(base + p * tp_d, tp_d, ls, heads)]
    plan = plan_transfers(src, dst)
    check_exact(src, dst, plan)
    assert all(t.src < base <= t.dst for t in plan)


def test_replicated_tensors_are_spread_over_the_sources():
    # MLA: the latent of 4 layers is on both prefill TP ranks; four decode ranks each need all of it
    src = mla_rank(0, 2, range(4))
    dst = mla_rank(2, 4, range(4))
    plan = plan_transfers(src, dst)
    check_exact(src, dst, plan)
    per_dst_src = {(t.dst, t.src) for t in plan}
    assert per_dst_src == {(2, 0), (3, 1), (4, 0), (5, 1)}  # sources alternate by destination index
    assert len(plan) == 4 * 8  # one transfer per tensor per destination


def test_dsa_layers_without_an_indexer_send_no_index_keys():
    shared = lambda i: i % 2 == 0  # noqa: E731 -- GLM-5: odd layers reuse the previous indexer
    src = mla_rank(0, 1, range(0, 2), shared) + mla_rank(1, 1, range(2, 4), shared)
    dst = mla_rank(2, 2, range(4), shared)
    plan = plan_transfers(src, dst)
    check_exact(src, dst, plan)
    assert sum(t.name.endswith("index_k") for t in plan) == 2 * 2


def test_sharded_heads_cut_at_source_boundaries_and_merge():
    # prefill TP 4 holds 2 heads each of 8; decode TP 1 needs all 8: four transfers of 2 heads
    src = gqa_rank(0, 4, range(1), 8)
    dst = gqa_rank(4, 1, range(1), 8)
    plan = [t for t in plan_transfers(src, dst) if t.name.endswith(".k")]
    assert [(t.src, t.start, t.end, t.dst_offset) for t in plan] == [(0, 0, 2, 0), (1, 2, 4, 2), (2, 4, 6, 4),
                                                                      (3, 6, 8, 6)]
    # prefill TP 1 holds all 8 heads; decode TP 4 needs 2 each: one transfer each, from the middle
    plan = [t for t in plan_transfers(dst, src) if t.name.endswith(".k")]
    assert [(t.dst, t.start, t.src_offset) for t in plan] == [(0, 0, 0), (1, 2, 2), (2, 4, 4), (3, 6, 6)]


def test_bytes_received_equal_the_destinations_cache():
    tokens, head_dim, elem = 37, 16, 4
    src = [h for p in range(2) for h in gqa_rank(2 * p, 2, range(3 * p, 3 * p + 3), 4)]
    dst = gqa_rank(4, 4, range(6), 4)
    row = {p.name: tokens * head_dim * elem for h in src for p in h.pieces}  # bytes of one head
    got = bytes_per_rank(plan_transfers(src, dst), row)
    assert got == {4 + r: 6 * 2 * tokens * head_dim * elem for r in range(4)}  # 6 layers x (k, v) x 1 head


def test_missing_or_mismatched_sources_are_errors():
    with pytest.raises(ValueError, match=r"needs model.layers.4.self_attn.latent, which no source holds"):
        plan_transfers(mla_rank(0, 1, range(4)), mla_rank(1, 1, range(6)))
    src = [Holding(0, (Piece("x", 0, 0, 2, 4),))]
    with pytest.raises(ValueError, match=r"needs \[2, 4\) of dim 0 of x, which no source holds"):
        plan_transfers(src, [Holding(1, (Piece("x", 0, 0, 4, 4),))])
    with pytest.raises(ValueError, match="sliced along dim 0 of 4, rank 1 needs dim None of 1"):
        plan_transfers(src, [Holding(1, (Piece.whole("x"),))])
    with pytest.raises(ValueError, match=r"slice \[2, 2\) of 4 is empty"):
        Piece("x", 0, 2, 2, 4)


def test_one_destination_needing_everything_is_a_writer_plan():
    # the directory form: a replicated tensor is written once, by the lowest rank holding it
    src = mla_rank(0, 2, range(2)) + gqa_rank(2, 2, range(2, 3), 1)
    full = Holding(-1, tuple(p if p.dim is None else Piece(p.name, p.dim, 0, p.full, p.full)
                             for p in {p.name: p for h in src for p in h.pieces}.values()))
    plan = plan_transfers(src, [full])
    check_exact(src, [full], plan)
    assert {t.src for t in plan} == {0, 2}
    assert len(plan) == 2 * 2 + 2  # 2 layers x (latent, index_k) + (k, v) of the GQA layer, one transfer each


def test_shape_problem_compares_all_but_the_token_and_sliced_dims():
    # GQA: [heads, tokens, head_dim], heads sliced: another head count or token count is no problem
    assert shape_problem("k", (2, 37, 64), "float32", (1, None, 64), "float32", sliced_dim=0) is None
    assert shape_problem("k", (2, 37, 64), "torch.float32", (2, None, 64), "float32") is None
    assert shape_problem("k", (2, 37, 64), "float32", (1, None, 32), "float32", sliced_dim=0) == \
        "k is [2, 37, 64] float32, but its caches here are [any, tokens, 32] float32"
    assert shape_problem("latent", (37, 24), "float32", (None, 24), "bfloat16") == \
        "latent is [37, 24] float32, but its caches here are [tokens, 24] bfloat16"
    assert shape_problem("latent", (37, 24, 1), "float32", (None, 24), "float32") is not None  # another rank
