"""Prefill here with context parallelism, decode there: a CP2 x PP2 prefill instance (VPP-Async, each
stage on a CP group of 2 ranks, every KV cache sharded over them) hands its request over to a TP2
decode instance, and to a CP2 decode instance (each decode rank receiving its token shard), and
saves it to a directory (each CP rank writing its shard) that TP2, CP2 and TP1 decode instances
load, in one world of 6 gloo ranks.

Each TP decode rank receives its layers and heads of every CP shard and puts the rows at their tokens,
so it holds every token in order; each CP decode rank holds its shard's rows at the positions its
stages record. Greedy tokens equal transformers' ``generate`` (tiny Hugging Face checkpoints of 6
layers: Qwen3-MoE, its one KV head replicated at TP 2; GLM-5, MLA's latent and the DSA indexer's
keys, some layers sharing another's top-k), and the installed caches equal an unsplit prefill's row
by row (decoding alone cannot tell rows apart: attention over permuted K/V pairs is the same). The
bytes each decode rank receives equal its caches' size from the config (closed form: every token
once, no padding), and the prefill ranks send exactly what the decode ranks receive. Broken variants
(a load putting rows at reversed positions, CP decode ranks recording each other's positions) must
fail the row check.
"""

from __future__ import annotations

import pytest
import torch

from tests.kv.test_handover import _cache_bytes_per_token


NEW = 6
FAMILIES = ("qwen3_moe", "glm_moe_dsa")  # K/V sliced by heads; MLA latent + DSA indexer keys (shared ones)
PROMPT = 37  # chunks of 8: 8, 8, 8, 8, 5 (the last ragged: the CP ranks hold 18 and 19 rows)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    from tests.models.hf_tiny import VOCAB, saved_with_greedy

    root = tmp_path_factory.mktemp("cp-handover")
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(3))
    out = saved_with_greedy(root, FAMILIES, prompt, NEW, num_hidden_layers=6)
    return prompt, out


def _rows_error(pipe, request, expected) -> float:
    """Largest difference between this rank's caches of ``request`` and an unsplit prefill's
    (``expected``, every token in order) at this rank's heads and at the tokens its rows hold."""
    from vpp.kv.handover import cache_shapes_of, local_caches
    shapes, positions = cache_shapes_of(pipe.stages), pipe.stages[0].cache_positions(request)
    slices = {n: sl for st in pipe.stages for n, sl in st.cache_slices().items()}
    worst = 0.0
    for name, x in local_caches(pipe, request).items():
        ref = expected[name]
        if slices[name] is not None:  # this rank's KV heads
            dim, start, end, _ = slices[name]
            ref = ref.narrow(dim, start, end - start)
        if positions is not None:  # this CP rank's tokens, in its row order
            ref = ref.index_select(list(shapes[name][0]).index(None), positions)
        if x.shape != ref.shape:
            return float("inf")
        worst = max(worst, float((x - ref).abs().max()))
    return worst


def _decode(pipe, request, first, greedy):
    generated = {request: list(first)}
    pipe.continue_generation(generated, NEW, greedy)
    pipe.release(request)
    return generated[request]


def _broken_loads(tp1, cp_pipe, expected, directory) -> dict:
    """A TP1 load putting rows at reversed positions, and a CP2 load whose ranks record each other's
    positions: each must fail the row check (their greedy tokens may still agree)."""
    import vpp.kv.files as files
    out = {}
    good_rows, good_install = files.rows_between, files.install_caches
    files.rows_between = lambda src, dst, tokens: (lambda r: (r[0], r[1].flip(0)))(good_rows(src, dst, tokens))
    try:
        files.load_cache(tp1, 21, directory, reserve=NEW)
    finally:
        files.rows_between = good_rows
    for what, wrong in (("swapped shards", lambda positions: positions[::-1]),
                        ("reversed shards", lambda positions: [p.flip(0) for p in positions])):
        files.install_caches = lambda pipe, q, tensors, tokens, positions: good_install(pipe, q, tensors, tokens,
                                                                                       wrong(positions))
        try:  # the shards of 18 and 19 rows: swapped, the import itself refuses (every rank raises the same)
            files.load_cache(cp_pipe, 21, directory, reserve=NEW)
            out[what] = _rows_error(cp_pipe, 21, expected)
        except ValueError as exc:
            out[what] = str(exc)
        finally:
            files.install_caches = good_install
            cp_pipe.release(21)
    out["reversed rows"] = _rows_error(tp1, 21, expected)
    tp1.release(21)
    return out


def _world(rank, world, cases, prompt, directories):
    import vpp.kv.files as files
    from vpp.models.registry import open_model
    from vpp.models.run_layout import layout_for
    from vpp.parallel import ParallelGroups
    from vpp.parallel.instances import initialize_disaggregated
    from vpp.runtime import Pipeline, Sampler
    from vpp.kv.handover import hand_over

    link = initialize_disaggregated(1, 2, 2, 1, prefill_cp=2)  # decode: TP2
    link_cp = initialize_disaggregated(1, 2, 1, 1, prefill_cp=2, decode_cp=2)  # decode: CP2
    single = ParallelGroups.single()
    out = {}
    for name, path in cases.items():
        model = open_model(path)
        layout = layout_for(model, "vpp-async", 2) if link.is_prefill else model.layout("loop", 1)
        pipe = Pipeline(model.stages(layout, link.groups), link.groups, timeout_s=120)
        first = link.is_prefill and any(s.is_first for s in pipe.stages)
        greedy, ids = Sampler(), None
        if link.is_prefill:  # what vpp.kv.disaggregated.generate_disaggregated does, with the bytes kept
            res = pipe.prefill(prompt if first else None, 8, schedule="vpp-async", request_ids=[7])
            ids = [int(greedy.sample(pipe.next_logits(res, [7]))[0])]
        report = hand_over(pipe, link, [7] if link.is_prefill else None, payload=ids, reserve=NEW, release=False)
        out[(name, "bytes")] = (link.role, report.bytes_sent, report.bytes_received, report.tokens[7])
        first_tokens = list(report.payload)
        expected = None
        if link.is_prefill:  # each CP rank writes its shard
            files.save_cache(pipe, 7, directories[name], extra=dict(generated=first_tokens))
        else:  # the installed caches against an unsplit prefill's, row by row
            ref = model.build((0, model.num_layers), single)
            ref(prompt, "ref", 0)
            expected = ref.export_cache("ref")
            out[(name, "rows")] = _rows_error(pipe, 7, expected)
            out[(name, "tokens")] = _decode(pipe, 7, first_tokens, greedy)
        cp_pipe = None if link_cp.is_prefill else Pipeline(model.stages(model.layout("loop", 1), link_cp.groups),
                                                           link_cp.groups, timeout_s=120)
        report = hand_over(pipe if link.is_prefill else cp_pipe, link_cp, [7] if link.is_prefill else None,
                           payload=ids, reserve=NEW)  # the prefill ranks free request 7 now
        out[(name, "cp bytes")] = (report.bytes_sent, report.bytes_received)
        torch.distributed.barrier()  # the directory is complete
        if link.is_prefill:
            continue
        out[(name, "cp rows")] = _rows_error(cp_pipe, 7, expected)
        out[(name, "cp tokens")] = _decode(cp_pipe, 7, first_tokens, Sampler())
        for what, target in (("tp2", pipe), ("cp2", cp_pipe)):
            saved = files.load_cache(target, 8, directories[name], reserve=NEW)["extra"]["generated"]
            out[(name, f"load {what} rows")] = _rows_error(target, 8, expected)
            out[(name, f"load {what} tokens")] = _decode(target, 8, saved, Sampler())
        tp1 = Pipeline(model.stages(model.layout("loop", 1), single), single, timeout_s=120)
        files.load_cache(tp1, 8, directories[name], reserve=NEW)
        out[(name, "load tp1 rows")] = _rows_error(tp1, 8, expected)
        unsharded = directories[name] + "-tp1"  # vpp-kv/1, one shard: the CP2 reader splits it head-tail
        if rank == link_cp.decode_ranks[0]:
            files.save_cache(tp1, 8, unsharded, extra=dict(generated=first_tokens))
        out[(name, "load tp1 tokens")] = _decode(tp1, 8, first_tokens, Sampler())
        torch.distributed.barrier(group=link_cp.groups.instance_pg)
        files.load_cache(cp_pipe, 9, unsharded, reserve=NEW)
        out[(name, "load cp2 from tp1 rows")] = _rows_error(cp_pipe, 9, expected)
        out[(name, "load cp2 from tp1 tokens")] = _decode(cp_pipe, 9, first_tokens, Sampler())
        out.update({(name, k): v for k, v in _broken_loads(tp1, cp_pipe, expected, directories[name]).items()})
    return out


@pytest.fixture(scope="module")
def results(references, worlds, tmp_path_factory):
    prompt, refs = references
    root = tmp_path_factory.mktemp("cp-kv")
    directories = {name: str(root / name) for name in refs}
    return worlds.run(6, _world, {name: path for name, (path, _, _) in refs.items()}, prompt, directories,
                      timeout=900)


@pytest.mark.slow  # one case on the session's world of 6 ranks
@pytest.mark.parametrize("model_type", FAMILIES)
def test_cp2_pp2_prefill_tp2_decode_equals_transformers_generate(model_type, results, references):
    expected = references[1][model_type][1]
    for rank in (4, 5):  # the decode instance
        assert results[rank][(model_type, "tokens")] == expected, f"decode rank {rank}"


@pytest.mark.slow  # one case on the session's world of 6 ranks
@pytest.mark.parametrize("model_type", FAMILIES)
def test_each_decode_rank_holds_every_token_in_token_order(model_type, results):
    """Decoding alone cannot tell (attention and the indexer's top-k do not depend on the rows' order):
    the installed caches equal an unsplit prefill's, row t holding token t (Qwen's one KV head and
    MLA's latent are whole on each TP rank)."""
    for rank in (4, 5):
        assert results[rank][(model_type, "rows")] <= 1e-5, f"decode rank {rank}"


@pytest.mark.slow  # one case on the session's world of 6 ranks
@pytest.mark.parametrize("model_type", FAMILIES)
def test_each_decode_rank_receives_every_token_of_its_caches_once(model_type, results, references):
    cfg = references[1][model_type][2]
    moved = [r[(model_type, "bytes")] for r in results]
    assert [m[0] for m in moved] == ["prefill"] * 4 + ["decode"] * 2
    assert all(m[3] == PROMPT for m in moved)
    for role, sent, received, _ in moved[4:]:
        assert received == PROMPT * _cache_bytes_per_token(cfg, 2)
    assert sum(m[1] for m in moved[:4]) == sum(m[2] for m in moved[4:])
    assert all(m[1] > 0 for m in moved[:4])  # every CP shard of every stage sent its rows


@pytest.mark.slow  # one case on the session's world of 6 ranks
@pytest.mark.parametrize("model_type", FAMILIES)
def test_cp2_pp2_prefill_cp2_decode_equals_transformers_generate(model_type, results, references):
    """Each CP decode rank receives one prefill CP shard (the same CP size: no reordering), every token
    once over the two (closed form), installs it at its tokens and decodes as transformers."""
    expected, cfg = references[1][model_type][1:]
    for rank in (4, 5):
        assert results[rank][(model_type, "cp tokens")] == expected, f"decode rank {rank}"
        assert results[rank][(model_type, "cp rows")] <= 1e-5, f"decode rank {rank}"
    sent = sum(r[(model_type, "cp bytes")][0] for r in results[:4])
    received = [r[(model_type, "cp bytes")][1] for r in results[4:]]
    assert sum(received) == sent == PROMPT * _cache_bytes_per_token(cfg, 1)
    assert sorted(received) == sorted(n * _cache_bytes_per_token(cfg, 1) for n in (PROMPT // 2, PROMPT - PROMPT // 2))


@pytest.mark.slow  # one case on the session's world of 6 ranks
@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize("reader", ["tp2", "cp2", "tp1", "cp2 from tp1"])
def test_cp_kv_directory_loads_into_any_layout_and_decodes_as_transformers(model_type, reader, results, references):
    """Saved by the CP2 x PP2 instance (each CP rank its shard), loaded by a TP2, a CP2 and a TP1
    decode instance; the TP1 one's directory (one shard) loaded by a CP2 instance (split head-tail):
    each rank's caches equal an unsplit prefill's at its heads and tokens."""
    expected = references[1][model_type][1]
    for rank in (4, 5):
        assert results[rank][(model_type, f"load {reader} tokens")] == expected, f"decode rank {rank}"
        assert results[rank][(model_type, f"load {reader} rows")] <= 1e-5, f"decode rank {rank}"


@pytest.mark.slow  # one case on the session's world of 6 ranks
@pytest.mark.parametrize("model_type", FAMILIES)
def test_a_permuted_row_mapping_fails_the_row_check(model_type, results):
    for rank in (4, 5):
        res = results[rank]
        assert res[(model_type, "reversed rows")] > 1e-2  # a TP1 load's rows at reversed positions
        assert res[(model_type, "reversed shards")] > 1e-2  # CP ranks recording their rows' tokens reversed
        assert "CP rank" in res[(model_type, "swapped shards")] and "rows" in res[(model_type, "swapped shards")]
