"""Prefill here, decode there: a request's caches handed from a prefill instance to a decode
instance of another layout in one world, against transformers' greedy ``generate``.

One spawned world of 4 ranks, split twice: prefill TP1 x PP2 (a V, vpp-async) -> decode TP2 x PP1,
and prefill TP2 x PP1 (cpp) -> decode TP1 x PP2. Every family (tiny Hugging Face checkpoints of 6
layers; Qwen has one KV head, replicated at TP 2) decodes 12 tokens equal to transformers'; the
directory form (written by the prefill instance, read by the decode instance) gives the same tokens;
the bytes each decode rank receives equal its caches' size computed from the config (closed form),
and the prefill ranks send exactly what the decode ranks receive.
"""

from __future__ import annotations

import pytest
import torch

NEW = 12


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    from tests.models.hf_tiny import MODEL_TYPES, VOCAB, saved_with_greedy

    root = tmp_path_factory.mktemp("handover")
    prompt = torch.randint(0, VOCAB, (37,), generator=torch.Generator().manual_seed(3))
    out = saved_with_greedy(root, MODEL_TYPES, prompt, NEW, num_hidden_layers=6)
    return root, prompt, out


def _pipe(model, link, schedule, pp_p, pp_d):
    from vpp.models.run_layout import layout_for
    from vpp.runtime import Pipeline
    layout = layout_for(model, schedule, pp_p) if link.is_prefill else model.layout("loop", pp_d)
    return Pipeline(model.stages(layout, link.groups), link.groups, timeout_s=120)


def _world(rank, world, cases, prompt, kv_root):
    import torch.distributed as dist

    from vpp.models.registry import open_model
    from vpp.parallel.instances import initialize_disaggregated
    from vpp.runtime import Sampler
    from vpp.kv.disaggregated import generate_disaggregated
    from vpp.kv.handover import hand_over
    from vpp.kv.files import load_cache, save_cache

    out = {}
    for (tp_p, pp_p, tp_d, pp_d, schedule) in [(1, 2, 2, 1, "vpp-async"), (2, 1, 1, 2, "cpp")]:
        link = initialize_disaggregated(tp_p, pp_p, tp_d, pp_d)
        for name, path in cases.items():
            model = open_model(path)
            pipe = _pipe(model, link, schedule, pp_p, pp_d)
            first = link.is_prefill and any(s.is_first for s in pipe.stages)
            gen = generate_disaggregated(pipe, link, prompt if first else None, NEW, 8, schedule=schedule)
            out[(tp_p, pp_p, name, "network")] = gen.tokens[0] if not link.is_prefill else None
            if (tp_p, pp_p) != (1, 2):
                continue
            # hand_over by hand: the bytes, then decode on from the caches it installed
            greedy = Sampler()
            ids = None
            if link.is_prefill:
                res = pipe.prefill(prompt if first else None, 8, schedule=schedule, request_ids=[7])
                ids = [int(greedy.sample(pipe.next_logits(res, [7]))[0])]
            report = _logged(lambda: hand_over(pipe, link, [7] if link.is_prefill else None, payload=ids,
                                               reserve=NEW), out, (name, "first transfers", rank))
            out[(name, "bytes", rank)] = (report.bytes_sent, report.bytes_received, report.cache_bytes,
                                          report.tokens[7])
            if not link.is_prefill:
                generated = {7: list(report.payload)}
                pipe.continue_generation(generated, NEW, greedy)
                out[(name, "by hand", rank)] = generated[7]
                pipe.release(7)
            # the directory form: written by the prefill instance, read by the decode instance
            directory = f"{kv_root}/{name}"
            if link.is_prefill:
                res = pipe.prefill(prompt if first else None, 8, schedule=schedule, request_ids=[5])
                tok = int(greedy.sample(pipe.next_logits(res, [5]))[0])
                save_cache(pipe, 5, directory, extra={"generated": [tok]})
                pipe.release(5)
            dist.barrier()
            if not link.is_prefill:
                manifest = load_cache(pipe, 11, directory, reserve=NEW)
                generated = {11: list(manifest["extra"]["generated"])}
                pipe.continue_generation(generated, NEW, greedy)
                out[(name, "directory", rank)] = (generated[11], manifest["writer"])
                pipe.release(11)
    return out


def _logged(call, out, key):
    """Run ``call`` with the hand-over's transfers logged: ``out[key]`` = the elements of the first
    transfer with each peer (the pair's set-up, issue 33 item 6: one element before any payload)."""
    import vpp.kv.handover as handover_module
    real = handover_module.dist
    first: dict[int, int] = {}

    class Logged:
        def __getattr__(self, name):
            return getattr(real, name)

        def isend(self, tensor, dst, **kw):
            first.setdefault(dst, tensor.numel())
            return real.isend(tensor, dst=dst, **kw)

        def irecv(self, tensor, src, **kw):
            first.setdefault(src, tensor.numel())
            return real.irecv(tensor, src=src, **kw)

    handover_module.dist = Logged()
    try:
        return call()
    finally:
        handover_module.dist = real
        out[key] = first


def _cache_bytes_per_token(cfg: dict, tp: int) -> int:
    """Bytes per token of one decode rank's caches over all layers (float32), from the config."""
    layers = cfg["num_hidden_layers"]
    if cfg["model_type"] == "qwen3_moe":
        local_heads = max(cfg["num_key_value_heads"] // tp, 1)  # fewer KV heads than ranks: one replica each
        return layers * 2 * local_heads * cfg["head_dim"] * 4
    per_layer = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 4
    if cfg["model_type"] == "deepseek_v32":
        indexers = layers
    elif cfg["model_type"] == "glm_moe_dsa":
        indexers = sum(t == "full" for t in cfg["indexer_types"])
    else:
        indexers = 0
    return layers * per_layer + (indexers * cfg["index_head_dim"] * 4 if indexers else 0)


@pytest.fixture(scope="module")
def world_results(references, tmp_path_factory, worlds):
    _, prompt, refs = references
    cases = {name: path for name, (path, _, _) in refs.items()}
    kv_root = tmp_path_factory.mktemp("kv")
    per_rank = worlds.run(4, _world, cases, prompt, str(kv_root), timeout=900)
    merged = {}
    for r in per_rank:
        merged.update({k: v for k, v in r.items() if v is not None})
    return merged


@pytest.mark.slow
def test_each_pair_is_set_up_with_one_element_before_its_payload(world_results):
    firsts = {k: v for k, v in world_results.items() if k[1] == "first transfers"}
    assert firsts and any(firsts.values())  # every family ran, and some rank moved bytes
    for key, first in firsts.items():
        assert all(n == 1 for n in first.values()), (key, first)


@pytest.mark.slow
def test_decode_on_another_layout_matches_transformers(references, world_results):
    _, _, refs = references
    for name, (_, tokens, _) in refs.items():
        assert world_results[(1, 2, name, "network")] == tokens, name
        assert world_results[(2, 1, name, "network")] == tokens, name
        for rank in (2, 3):
            assert world_results[(name, "by hand", rank)] == tokens, (name, rank)


@pytest.mark.slow
def test_directory_round_trip_matches_transformers(references, world_results):
    _, _, refs = references
    for name, (_, tokens, _) in refs.items():
        for rank in (2, 3):
            got, writer = world_results[(name, "directory", rank)]
            assert got == tokens, (name, rank)
            assert (writer["tp"], writer["pp"]) == (1, 2)


@pytest.mark.slow
def test_handover_bytes_equal_the_decode_caches(references, world_results):
    _, prompt, refs = references
    for name, (_, _, cfg) in refs.items():
        sent = sum(world_results[(name, "bytes", r)][0] for r in (0, 1))
        expected = prompt.numel() * _cache_bytes_per_token(cfg, tp=2)
        for rank in (2, 3):
            _, received, held, tokens = world_results[(name, "bytes", rank)]
            assert tokens == prompt.numel()
            assert received == held == expected, (name, rank, received, expected)
        assert sent == 2 * expected, name  # every byte sent once: what the two decode ranks hold
