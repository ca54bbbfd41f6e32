"""Attention in pieces: the log-sum-exp pieces against explicit scores, their merge against one pass
over all keys, MLA's prefix attention split into key blocks by a small workspace budget against the
same module with an unbounded budget (chunk sizes down to one token), DSA's blocks, and the KV caches'
one-time reservation. (Chunked MLA/DSA against transformers: tests/models/test_parity.py, with the
default budget; the budget there never splits a block, so the blocked path is compared here.)

Tolerance: fp32, reductions of <= 40 terms reordered across blocks and merged through exp/log of
O(10) log-sum-exps: a few 1e-7; ``atol=rtol=1e-5`` as in test_attention.py. A wrong merge weight, a
block whose causal mask is off by one or a lost block moves outputs by O(0.1).
"""

from __future__ import annotations

import pytest
import torch

import vpp.transformer.attention.kernel as kernel_module
from tests.models.test_attention import _mla, _naive_attention, _randn
from vpp.transformer.attention import Chunk, DSASpec, GrowingBuffer, RequestCache, RopeSpec, RotaryEmbedding
from vpp.transformer.attention.kernel import attention_lse, causal_attention, math_lse, merge_partials
from vpp.transformer.attention.workspace import rows_per_block, set_workspace_bytes

TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hq,hk,lq,lk,causal", [(4, 4, 5, 9, False), (4, 2, 5, 9, False), (6, 1, 3, 3, True),
                                                (4, 2, 7, 7, True), (2, 2, 1, 1, True)])
def test_pieces_match_explicit_scores(hq, hk, lq, lk, causal):
    q, k, v = _randn(1, hq, lq, 8), _randn(2, hk, lk, 8), _randn(3, hk, lk, 6)
    out, lse = attention_lse(q, k, v, 0.4, causal=causal)
    kk, vv = k.repeat_interleave(hq // hk, 0), v.repeat_interleave(hq // hk, 0)
    scores = q @ kk.transpose(1, 2) * 0.4
    if causal:
        scores = scores.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), **TOL)
    torch.testing.assert_close(out, scores.softmax(-1) @ vv, **TOL)
    ref_out, ref_lse = math_lse(q, kk, vv, 0.4, causal)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)


def test_a_causal_piece_needs_a_square():
    with pytest.raises(ValueError, match="a causal piece needs as many queries as keys, got 3 and 5"):
        attention_lse(_randn(0, 2, 3, 4), _randn(0, 2, 5, 4), _randn(0, 2, 5, 4), 1.0, causal=True)


def test_merging_pieces_equals_one_pass_over_every_key():
    q, k, v = _randn(1, 4, 6, 8), _randn(2, 2, 30, 8), _randn(3, 2, 30, 5)
    whole = attention_lse(q, k, v, 0.3)
    acc = None
    for start, end in ((0, 7), (7, 8), (8, 30)):  # uneven pieces, one of a single key
        part = attention_lse(q, k[:, start:end], v[:, start:end], 0.3)
        acc = part if acc is None else merge_partials(acc, part)
    torch.testing.assert_close(acc[0], whole[0], **TOL)
    torch.testing.assert_close(acc[1], whole[1], **TOL)


@pytest.mark.parametrize("lq,lk", [(3, 7), (1, 40), (16, 16), (5, 6)])
def test_the_cpu_causal_kernel_after_a_prefix_builds_no_mask(lq, lk):
    """Prefix piece + square diagonal piece, merged, equals the bottom-right causal attention."""
    q, k, v = _randn(1, 4, lq, 8), _randn(2, 2, lk, 8), _randn(3, 2, lk, 8)
    allowed = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
    torch.testing.assert_close(causal_attention(q, k, v, 0.3), _naive_attention(q, k, v, 0.3, allowed), **TOL)


def _run(module, x, chunk):
    total = x.shape[0]
    cos, sin = RotaryEmbedding(RopeSpec(8))(torch.arange(total), torch.float32)
    with torch.inference_mode():
        out = [module(x[s:s + chunk], Chunk("r", s, cos[s:s + chunk], sin[s:s + chunk])) for s in range(0, total, chunk)]
    module.cache.release("r")
    return torch.cat(out)


@pytest.mark.parametrize("keys_per_block", [1, 3, 8])
@pytest.mark.parametrize("chunk", [1, 5, 23])
def test_mla_prefix_blocks_equal_the_unblocked_attention(monkeypatch, keys_per_block, chunk):
    x = _randn(5, 23, 32)
    unbounded = _mla()
    unbounded.workspace_bytes = 1 << 40
    expected = _run(unbounded, x, chunk)
    blocked = _mla()  # the same weights (deterministic)
    blocked.workspace_bytes = keys_per_block * 4 * (8 + 6 + 3 * 16) * 4  # heads x (nope + v + 3 qk) x fp32
    assert blocked.key_block(torch.device("cpu"), torch.float32) == keys_per_block
    keys_seen = []
    real = kernel_module.lse_kernel_for

    def spy(device_type):
        kernel = real(device_type)
        return lambda q, k, *rest: keys_seen.append(k.shape[1]) or kernel(q, k, *rest)
    monkeypatch.setattr(kernel_module, "lse_kernel_for", spy)
    torch.testing.assert_close(_run(blocked, x, chunk), expected, **TOL)
    if keys_per_block < 23 and chunk > 1:  # one-token chunks take the absorbed path (test below)
        assert keys_seen and max(keys_seen) <= keys_per_block  # no piece saw more keys than the budget
    assert rows_per_block(1, 10) == 1 and rows_per_block(100, 10) == 10


def test_the_workspace_budget_reaches_every_attention_module():
    module = _mla(DSASpec(index_topk=6, index_n_heads=16, index_head_dim=12))
    assert set_workspace_bytes(module, 4096) == 2  # MLA and its indexer
    assert module.workspace_bytes == module.indexer.workspace_bytes == 4096
    with pytest.raises(ValueError, match="workspace budget 0 bytes must be >= 1"):
        set_workspace_bytes(module, 0)


# --- caches allocated once ---------------------------------------------------------------------------

def test_a_reserved_buffer_is_allocated_once_at_its_exact_size():
    buf = GrowingBuffer(dim=1, reserved=20)
    rows = [_randn(i, 2, n, 3) for i, n in enumerate((7, 1, 1, 11))]  # 20 tokens: 7 + three decode-like steps
    storages = set()
    for r in rows:
        buf.append(r)
        storages.add(buf._data.data_ptr())
        assert buf.capacity == 20
    assert len(storages) == 1 and buf.nbytes == 2 * 20 * 3 * 4
    assert torch.equal(buf.view(), torch.cat(rows, dim=1))
    buf.append(_randn(9, 2, 1, 3))  # past the reservation: still works, by growing
    assert buf.length == 21 and buf.capacity == 40


def test_request_cache_reserve_grows_never_shrinks_and_counts_bytes():
    cache = RequestCache("test", {"k": 0, "v": 0})
    cache.reserve("a", 10)
    assert cache.requests() == [] and cache.length("a") == 0 and cache.get("a") == {}
    cache.append("a", 0, k=torch.zeros(4, 2), v=torch.zeros(4, 2))
    assert cache.nbytes("a") == 2 * 10 * 2 * 4
    cache.reserve("a", 6)  # smaller: nothing changes
    assert cache.nbytes("a") == 2 * 10 * 2 * 4
    cache.reserve("a", 16)  # larger: one resize to exactly 16, contents kept
    assert cache.nbytes("a") == 2 * 16 * 2 * 4 and cache.length("a") == 4
    cache.append("b", 0, k=torch.ones(3, 2), v=torch.ones(3, 2))  # unreserved: exactly what it holds
    assert cache.nbytes("b") == 2 * 3 * 2 * 4 and cache.nbytes() == cache.nbytes("a") + cache.nbytes("b")
    assert sorted(cache.requests()) == ["a", "b"]
    with pytest.raises(ValueError, match="cannot reserve -1 tokens"):
        cache.reserve("c", -1)


@pytest.mark.parametrize("keys_per_block", [1, 4, 64])
def test_one_query_attends_in_the_latent_space_within_the_budget(monkeypatch, keys_per_block):
    """A decode step (one query) never expands the cache: it equals the expanded dense attention, and
    with a small budget reads the latent in blocks of at most that many keys."""
    import vpp.transformer.attention.mla as mla_module
    x = _randn(6, 23, 32)
    module = _mla()
    module.workspace_bytes = 1 << 40
    expected = _run(module, x, 23)[-1:]  # the last token as part of one dense chunk (expanded K/V)
    blocks = []
    real_rows = mla_module.rows_per_block
    monkeypatch.setattr(mla_module, "rows_per_block", lambda budget, row: blocks.append(1) or keys_per_block)
    module.cache.release("r")
    cos, sin = RotaryEmbedding(RopeSpec(8))(torch.arange(23), torch.float32)
    with torch.inference_mode():
        module(x[:22], Chunk("r", 0, cos[:22], sin[:22]))
        expand = []
        monkeypatch.setattr(module, "_expand", lambda latent: expand.append(1))
        got = module(x[22:], Chunk("r", 22, cos[22:], sin[22:]))
    torch.testing.assert_close(got, expected, **TOL)
    assert expand == [] and blocks  # no per-head expansion; blocks sized by the budget
    assert real_rows(1, 10) == 1
