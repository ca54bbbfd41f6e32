"""Which cached rows move where when a context-parallel cache changes layout (pure: no process group),
and the manifest checks of a CP directory (``vpp-kv/2``). The moves on real ranks, with parity
against transformers, are tests/kv/test_cp_handover.py's (slow)."""

from __future__ import annotations

import json

import pytest
import torch

from vpp.kv.token_rows import coverage_problem, from_runs, reader_shards, rows_between, to_runs
from vpp.transformer.attention.context_parallel import Split


def _chunked(tokens: int, chunk: int, cp: int) -> list[torch.Tensor]:
    """Each CP rank's tokens after a prefill in chunks of ``chunk`` (as vpp.models.cp_state records them)."""
    held = [torch.zeros(0, dtype=torch.long) for _ in range(cp)]
    for offset in range(0, tokens, chunk):
        split = Split(min(chunk, tokens - offset), cp)
        held = [torch.cat((h, offset + split.index(r))) for r, h in enumerate(held)]
    return held


def test_runs_round_trip_two_per_chunk_and_rank():
    held = _chunked(37, 8, 2)
    for h in held:
        assert torch.equal(from_runs(to_runs(h)), h)
    # chunks 8, 8, 8, 8, 5 in pieces of 2: a rank's tail piece of one chunk and its head piece of the next meet
    assert [to_runs(h) for h in held] == [[[0, 2], [6, 10], [14, 18], [22, 26], [30, 34]],
                                          [[2, 6], [10, 14], [18, 22], [26, 30], [34, 37]]]
    assert to_runs([]) == [] and len(from_runs([])) == 0


@pytest.mark.parametrize("writer_cp,reader_cp", [(2, 2), (2, 1), (1, 2), (2, 3), (3, 2), (4, 2)])
def test_every_reader_rank_gets_each_of_its_tokens_once_from_the_shard_that_holds_it(writer_cp, reader_cp):
    tokens = 37
    held = _chunked(tokens, 8, writer_cp)
    readers = reader_shards(held, tokens, reader_cp)
    assert coverage_problem([to_runs(r) for r in readers], tokens) is None
    if reader_cp == writer_cp:
        assert all(torch.equal(a, b) for a, b in zip(readers, held))  # each reader takes one shard whole
    elif reader_cp == 1:
        assert torch.equal(readers[0], torch.arange(tokens))
    else:
        assert max(map(len, readers)) - min(map(len, readers)) <= 2 * -(-tokens // (2 * reader_cp))
    for dst in readers:
        filled = torch.zeros(len(dst), dtype=torch.long)
        for src in held:
            rows, at = rows_between(src, dst, tokens)
            assert torch.equal(src[rows], dst[at])  # the same token on both sides
            assert bool((rows[1:] > rows[:-1]).all())  # in the writer's row order
            filled.index_add_(0, at, torch.ones_like(at))
        assert bool((filled == 1).all())  # every row of the reader once


def test_a_permuted_mapping_is_caught():
    held = _chunked(37, 8, 2)
    rows, at = rows_between(held[0], torch.arange(37), 37)
    assert not torch.equal(held[0][rows], at.flip(0))  # reversed rows land on other tokens


def test_coverage_names_the_numbers():
    assert coverage_problem([[[0, 20]], [[18, 37]]], 37) == (
        "the 2 shards hold 39 rows for 37 tokens: 0 tokens missing, 2 rows repeating a token, 0 rows past the last "
        "token")
    assert "3 tokens missing" in coverage_problem([[[0, 34]]], 37)
    assert "1 rows past the last token" in coverage_problem([[[0, 38]]], 37)
    assert coverage_problem([[[0, 1], [0, 1]], [[10 ** 12, 10 ** 12 + 1]]], 37).endswith(  # no allocation
        "36 tokens missing, 1 rows repeating a token, 1 rows past the last token")
    assert coverage_problem([[[0, 2], [6, 10]], [[2, 6]]], 10) is None  # runs in any order


def _manifest(tmp_path, **change):
    name = "model.layers.0.self_attn.latent"
    m = dict(format="vpp-kv/2", request=0, tokens=37, writer=dict(tp=1, pp=1, cp=2, stages=[[[0, 1]]]), extra={},
             save_id="x", shards=[to_runs(h) for h in _chunked(37, 8, 2)],
             tensors=[dict(file=f"rank-0000{c}.safetensors", key=name, name=name, dim=None, start=0, end=1, full=1,
                           shape=[n, 8], dtype="float32", shard=c) for c, n in enumerate((19, 18))])
    m.update(change)
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    return str(tmp_path)


def test_a_cp_manifest_with_shards_that_do_not_tile_the_tokens_is_refused_in_one_line(tmp_path):
    from vpp.kv.files import read_manifest
    assert read_manifest(_manifest(tmp_path))["writer"]["cp"] == 2
    with pytest.raises(ValueError, match=r"do not hold each token once: the 2 shards hold 38 rows for 37 tokens: "
                                         r"0 tokens missing, 1 rows repeating a token"):
        read_manifest(_manifest(tmp_path, shards=[[[0, 19]], [[18, 37]]]))
    with pytest.raises(ValueError, match=r"'shards' must list, per CP rank, runs"):
        read_manifest(_manifest(tmp_path, shards=[[[5, 3]]]))
    bad = json.loads((tmp_path / "manifest.json").read_text())["tensors"]
    bad[1]["shard"] = 2
    with pytest.raises(ValueError, match=r"tensors\[1\] \(model.layers.0.self_attn.latent\) names shard 2, the "
                                         r"manifest holds 2 shards"):
        read_manifest(_manifest(tmp_path, shards=[to_runs(h) for h in _chunked(37, 8, 2)], tensors=bad))
