"""Decode after prefill, against transformers' ``generate(do_sample=False)``.

For every family (qwen3_moe, deepseek_v3, deepseek_v32, glm_moe_dsa) as a tiny Hugging Face
checkpoint of 6 layers, greedy tokens after each prefill schedule (cpp, dcpp, vpp, vpp-async; and
vpp-packed for two requests) followed by 16 decode steps equal transformers' generate, at PP 1, 2, 3
and TP 1, 2 (one spawned run per grid, every case inside it). Two requests decoded together equal each
decoded alone; a request's caches exported and imported into fresh stages decode on identically;
seeded sampling gives the same tokens on every rank and across runs.

A covering design, not the full product (:func:`_plan`): on TP 2 x PP 2 every model runs every schedule
(the prompt alternating, so each model and each schedule meets both), with the hand-over and seeded
sampling; on each other grid every model runs one schedule, rotating so that the grid sees every
schedule, on one prompt (alternating), and the model that gets vpp-async also hands over and samples
there. So each (grid, model), (grid, schedule), (family, schedule) and (schedule, prompt) pair is
checked, and the hand-over and sampling on every grid; vpp-packed always runs both prompts together.

Prompts of 37 and 29 tokens in chunks of 8 (ragged), index_topk 8: DSA chunks and decode steps past
8 keys attend to 8 selected keys, so the sparse path is exercised in both phases. At PP 3 a V has 6
stages of one layer, which GLM-5's shared-indexer layers cannot start, so GLM runs there with an
indexer on every layer (its sharing is covered at PP 1 and 2).
"""

from __future__ import annotations

import pytest
import torch

NEW = 16
GRIDS = [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]  # (tp, pp)
SCHEDULES = ("cpp", "dcpp", "vpp", "vpp-async")
ALL = SCHEDULES + ("vpp-packed",)
FULL = (2, 2)  # the grid that runs the full product of models and schedules


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """(model_type, glm sharing) -> (path, prompts, transformers' greedy tokens per prompt)."""
    from tests.models.hf_tiny import MODEL_TYPES, PROMPTS, VOCAB, model

    root = tmp_path_factory.mktemp("gen")
    g = torch.Generator().manual_seed(1)
    prompts = {name: torch.randint(0, VOCAB, (n,), generator=g) for name, n in PROMPTS.items()}
    out = {}
    for model_type in MODEL_TYPES:
        for freq in ((2, 1) if model_type == "glm_moe_dsa" else (2,)):
            m = model(model_type, num_hidden_layers=6, index_topk_freq=freq)
            path = root / f"{model_type}-{freq}"
            m.save_pretrained(path)
            tokens = {}
            with torch.no_grad():
                for name, ids in prompts.items():
                    # an explicit mask: without one, generate takes pad_token_id tokens of the prompt as padding
                    seq = m.generate(ids[None], attention_mask=torch.ones_like(ids)[None], max_new_tokens=NEW,
                                     do_sample=False, pad_token_id=0, eos_token_id=None)
                    tokens[name] = seq[0, ids.numel():].tolist()
            out[(model_type, freq)] = (str(path), prompts, tokens)
    return out


def _cases(references, pp):
    """The (key, path) of every model this grid runs: GLM's sharing model needs <= 4 V stages."""
    return [(key, path) for key, (path, _, _) in references.items()
            if not (key[0] == "glm_moe_dsa" and (key[1] == 2) == (pp == 3))]


def _plan(references, tp, pp):
    """[(key, path, ((schedule, prompt names), ...))] that grid (tp, pp) runs (the covering design above)."""
    cases = _cases(references, pp)
    if (tp, pp) == FULL:  # every schedule, the prompt alternating between models and schedules
        return [(key, path, tuple((s, (("a", "b")[(i + j) % 2],)) for j, s in enumerate(ALL)))
                for i, (key, path) in enumerate(cases)]
    shift = GRIDS.index((tp, pp))
    runs = [[ALL[(i + shift) % len(ALL)]] for i in range(len(cases))]
    for j in range(len(cases), len(ALL)):  # fewer models than schedules: the first ones take two
        runs[j - len(cases)].append(ALL[(j + shift) % len(ALL)])
    return [(key, path, tuple((s, (("a", "b")[(i + shift + k) % 2],)) for k, s in enumerate(runs[i])))
            for i, (key, path) in enumerate(cases)]


def _expected(references, tp, pp):
    """The (key, what) results grid (tp, pp) must return."""
    out = set()
    for key, _, runs in _plan(references, tp, pp):
        for schedule, names in runs:
            if schedule == "vpp-packed":  # both prompts, as two requests
                out |= {(key, "packed-a"), (key, "packed-b")}
                continue
            out |= {(key, f"{schedule}-{name}") for name in names}
            if schedule == "vpp-async":
                out |= {(key, "handover-a"), (key, "sampled")}
    return out


def _grid_run(rank, world, tp, pp, cases, prompts):
    """Every planned case on this grid; returns {(model key, what): tokens} on global rank 0."""
    from vpp.models.registry import open_model
    from vpp.models.run_layout import layout_for
    from vpp.parallel import initialize_model_parallel
    from vpp.runtime import Pipeline, profile_planner

    groups = initialize_model_parallel(tp, pp)
    results = {}
    for key, path, runs in cases:
        model = open_model(path)
        for schedule, names in runs:
            stages = model.stages(layout_for(model, schedule, pp), groups)
            pipe = Pipeline(stages, groups, timeout_s=120)
            first = any(s.is_first for s in stages)
            chunking = profile_planner(stages, groups, 8).chunk_sizes if schedule == "dcpp" else 8
            if schedule == "vpp-packed":  # two requests, prefilled packed and decoded together
                both = [prompts["a"], prompts["b"]] if first else None
                gen = pipe.generate(both, NEW, chunking, schedule=schedule)
                results[(key, "packed-a")], results[(key, "packed-b")] = gen.tokens[0], gen.tokens[1]
                continue
            for name in names:
                gen = pipe.generate(prompts[name] if first else None, NEW, chunking, schedule=schedule)
                results[(key, f"{schedule}-{name}")] = gen.tokens[0]
            if schedule == "vpp-async":
                results.update(_handover(pipe, model, schedule, groups, prompts, key, pp))
                results[(key, "sampled")] = _sampled(pipe, prompts["a"] if first else None)
    everyone = [None] * world
    torch.distributed.all_gather_object(everyone, results)
    return everyone


def _handover(pipe, model, schedule, groups, prompts, key, pp):
    """Prefill, decode 4 tokens, export the caches, import them into fresh stages, decode on."""
    from vpp.models.run_layout import layout_for
    from vpp.runtime import Pipeline, Sampler

    first = any(s.is_first for s in pipe.stages)
    out = pipe.prefill(prompts["a"] if first else None, 8, schedule=schedule, request_ids=[3])
    greedy = Sampler()
    tokens = [int(greedy.sample(pipe.next_logits(out, [3]))[0])]
    for _ in range(3):
        tokens.append(int(greedy.sample(pipe.decode(torch.tensor(tokens[-1:]), [3]))[0]))
    moved = pipe.export_cache(3)
    pipe.release(3)
    fresh = Pipeline(model.stages(layout_for(model, schedule, pp), groups), groups, timeout_s=120)
    fresh.import_cache(9, moved)
    while len(tokens) < NEW:
        tokens.append(int(greedy.sample(fresh.decode(torch.tensor(tokens[-1:]), [9]))[0]))
    fresh.release(9)
    return {(key, "handover-a"): tokens}


def _sampled(pipe, prompt):
    from vpp.runtime import Sampler
    runs = [pipe.generate(prompt, 8, 8, schedule="vpp-async", sampler=Sampler(0.9, 20, 0.9, seed=5)).tokens[0]
            for _ in range(2)]
    return runs


@pytest.fixture(scope="module")
def grid_results(references, worlds):
    prompts = next(iter(references.values()))[1]
    out = {}
    for tp, pp in GRIDS:
        per_rank = worlds.run(tp * pp, _grid_run, tp, pp, _plan(references, tp, pp), prompts, timeout=900)
        out[(tp, pp)] = per_rank[0]  # every rank's results, gathered
    return out


@pytest.mark.slow
@pytest.mark.parametrize("tp,pp", GRIDS, ids=[f"tp{t}-pp{p}" for t, p in GRIDS])
def test_greedy_generation_matches_transformers(references, grid_results, tp, pp):
    everyone = grid_results[(tp, pp)]
    mine = everyone[0]
    checked = 0
    for key, path in _cases(references, pp):
        ref = references[key][2]
        for what, tokens in mine.items():
            if what[0] != key or what[1] == "sampled":
                continue
            name = what[1].rsplit("-", 1)[1]
            assert tokens == ref[name], (tp, pp, key, what)
            checked += 1
        for rank, theirs in enumerate(everyone):  # every rank knows the same tokens
            assert theirs == mine, (tp, pp, rank)
    assert set(mine) == _expected(references, tp, pp)
    assert checked == len([w for w in mine if w[1] != "sampled"])


@pytest.mark.slow
def test_seeded_sampling_is_the_same_everywhere_and_every_time(references, grid_results):
    for (tp, pp), everyone in grid_results.items():
        sampled = [key for key, what in _expected(references, tp, pp) if what == "sampled"]
        assert sampled, (tp, pp)
        for key in sampled:
            first, second = everyone[0][(key, "sampled")]
            assert first == second, (tp, pp, key)  # the same seed gives the same tokens again
            assert all(r[(key, "sampled")] == [first, second] for r in everyone)


def test_the_design_covers_every_pair():
    """Each (grid, model), (grid, schedule), (family, schedule) and (schedule, prompt) pair runs somewhere,
    every grid hands over and samples, and every model of the full grid runs every schedule, each model
    and schedule there on both prompts (GLM's indexer-per-layer model runs only at PP 3, see the module
    docstring: its family's pairs come from the sharing model)."""
    from tests.models.hf_tiny import MODEL_TYPES
    refs = {(m, f): (f"{m}-{f}", None, None) for m in MODEL_TYPES for f in ((2, 1) if m == "glm_moe_dsa" else (2,))}
    grid_model, grid_schedule, family_schedule, schedule_prompt = set(), set(), set(), set()
    for tp, pp in GRIDS:
        plan = _plan(refs, tp, pp)
        assert [(k, p) for k, p, _ in plan] == _cases(refs, pp)
        for key, _, runs in plan:
            grid_model.add((tp, pp, key))
            grid_schedule |= {(tp, pp, s) for s, _ in runs}
            family_schedule |= {(key[0], s) for s, _ in runs}  # GLM with or without shared indexers
            schedule_prompt |= {(s, n) for s, names in runs for n in names}
            if (tp, pp) == FULL:
                assert [s for s, _ in runs] == list(ALL)
                assert {n for s, names in runs if s != "vpp-packed" for n in names} == {"a", "b"}, key
        if (tp, pp) == FULL:
            assert all({n for k, _, runs in plan for s, names in runs if s == s0 for n in names} == {"a", "b"}
                       for s0 in ALL if s0 != "vpp-packed")
        whats = {w for _, w in _expected(refs, tp, pp)}
        assert {"handover-a", "sampled"} <= whats, (tp, pp)
    assert grid_model == {(tp, pp, key) for tp, pp in GRIDS for key, _ in _cases(refs, pp)}
    assert grid_schedule == {(tp, pp, s) for tp, pp in GRIDS for s in ALL}
    assert family_schedule == {(model_type, s) for model_type in MODEL_TYPES for s in ALL}
    assert schedule_prompt == {(s, n) for s in ALL for n in "ab"}
