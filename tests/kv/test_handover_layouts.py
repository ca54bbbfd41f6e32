"""Prefill here, decode there, on uneven layouts and with the faults a deployment meets, against
transformers' greedy ``generate``.

One spawned world of 3 ranks, split five ways: prefill on a V of uneven stages [1, 2, 2, 1] (vpp-async)
-> decode on one rank; one prefill rank -> decode on a V [2, 1, 1, 2] and on an uneven loop [5, 1]
(two decode ranks); TP 1 -> TP 2 and TP 2 -> TP 1. Two prompts of different lengths (37 and 29 tokens,
chunks of 8) go through ``generate_disaggregated`` together; their tokens equal transformers'
(qwen3_moe with one KV head, deepseek_v32 and glm_moe_dsa with DSA's sparse path past 8 keys, as tiny
Hugging Face checkpoints of 6 layers; GLM where its shared-indexer layers allow the stage starts).

Faults, on the V -> one rank split: a decode instance running another model (4 layers instead of 6,
MLA's latent of another width, bfloat16 instead of float32), a request handed over twice and one
never prefilled, prefill ranks naming different requests (to hand over, or to save) are each the
same one-line ValueError on every rank, before any byte moves or is written (before:
the fewer-layer model decoded garbage, the others raised a bare RuntimeError on the decode rank alone
after the prefill ranks had freed the caches, or refused on the decode rank alone); no caches stay
behind on either instance, and the next hand-over decodes as transformers does. A prefill that fails
(NaN weights) raises its NonFiniteError on the prefill ranks and reaches the decode rank as one line.
"""

from __future__ import annotations

import re

import pytest
import torch

pytestmark = pytest.mark.slow  # every test here starts processes

NEW = 8
MODELS = ("qwen3_moe", "deepseek_v32", "glm_moe_dsa")
# name -> (prefill tp, pp, decode tp, pp), prefill layout, decode layout, models
SPLITS = {
    "v-uneven -> 1": ((1, 2, 1, 1), ("v", [1, 2, 2, 1]), ("loop", None), MODELS),
    "1 -> v-uneven": ((1, 1, 1, 2), ("loop", None), ("v", [2, 1, 1, 2]), MODELS[:2]),  # GLM: no stage at layer 2
    "1 -> loop-uneven": ((1, 1, 1, 2), ("loop", None), ("loop", [5, 1]), MODELS),
    "tp1 -> tp2": ((1, 1, 2, 1), ("loop", None), ("loop", None), MODELS[:2]),
    "tp2 -> tp1": ((2, 1, 1, 1), ("loop", None), ("loop", None), MODELS[:2]),
}
FAULTS = {  # name -> (prefill model, decode model, decode dtype, expected message)
    "fewer layers": ("qwen3_moe", "qwen3_moe-4", torch.float32,
                     r"the decode instance's model has 4 layers, the prefill instance's 6: a KV hand-over needs the "
                     r"same model on both"),
    "latent width": ("deepseek_v32", "deepseek_v32-rank32", torch.float32,
                     r"request 0 cannot go to global rank 2 \(decode\): model.layers.0.self_attn.latent is \[37, 24\] "
                     r"float32, but its caches here are \[tokens, 40\] float32"),
    "dtype": ("qwen3_moe", "qwen3_moe", torch.bfloat16,
              r"request 0 cannot go to global rank 2 \(decode\): model.layers.0.self_attn.k is \[1, 37, 16\] float32, "
              r"but its caches here are \[any, tokens, 16\] bfloat16"),
}


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """paths (model name -> checkpoint), prompts, transformers' greedy tokens per (model, prompt)."""
    from tests.models.hf_tiny import PROMPTS, VOCAB, model

    root = tmp_path_factory.mktemp("handover-layouts")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g) for n in PROMPTS.values()]
    paths, tokens = {}, {}
    for model_type in MODELS:
        m = model(model_type, num_hidden_layers=6)
        paths[model_type] = str(root / model_type)
        m.save_pretrained(paths[model_type])
        with torch.no_grad():
            for i, ids in enumerate(prompts):
                seq = m.generate(ids[None], attention_mask=torch.ones_like(ids)[None], max_new_tokens=NEW,
                                 do_sample=False, pad_token_id=0, eos_token_id=None)
                tokens[(model_type, i)] = seq[0, ids.numel():].tolist()
    for name, model_type, kw in (("qwen3_moe-4", "qwen3_moe", dict(num_hidden_layers=4)),
                                 ("deepseek_v32-rank32", "deepseek_v32", dict(num_hidden_layers=6, kv_lora_rank=32))):
        paths[name] = str(root / name)
        model(model_type, **kw).save_pretrained(paths[name])
    return paths, prompts, tokens


def _pipe(path, link, kind, partition, dtype=torch.float32):
    from vpp.models.registry import open_model
    from vpp.schedules import make_layout
    from vpp.runtime import Pipeline

    model = open_model(path, dtype=dtype)
    pp = link.prefill.pp if link.is_prefill else link.decode.pp
    layout = make_layout(kind, model.num_layers, pp, partition=partition)
    stages = [model.build(layout.stage_layers[s], link.groups) for s in layout.stages_of(link.groups.pp.rank)]
    return Pipeline(stages, link.groups, timeout_s=60)


def _left(pipe):
    return [st.requests() for st in pipe.stages]


def _world(rank, world, paths, prompts, kv_dir):
    from vpp.parallel.instances import initialize_disaggregated
    from vpp.kv.disaggregated import generate_disaggregated
    from vpp.kv.handover import hand_over
    from vpp.kv.files import save_cache

    out = {}
    for split, (sizes, prefill_layout, decode_layout, models) in SPLITS.items():
        link = initialize_disaggregated(*sizes)
        kind, partition = prefill_layout if link.is_prefill else decode_layout
        for name in models:
            pipe = _pipe(paths[name], link, kind, partition)
            first = link.is_prefill and any(s.is_first for s in pipe.stages)
            gen = generate_disaggregated(pipe, link, prompts if first else None, NEW, 8,
                                         schedule="vpp-async" if kind == "v" else "cpp")
            out[(split, name, rank)] = ([gen.tokens[0], gen.tokens[1]], link.role, _left(pipe))
    link = initialize_disaggregated(1, 2, 1, 1)
    kind, partition = ("v", [1, 2, 2, 1]) if link.is_prefill else ("loop", None)
    for fault, (prefill_model, decode_model, dtype, _) in FAULTS.items():
        path, dtype = (paths[prefill_model], torch.float32) if link.is_prefill else (paths[decode_model], dtype)
        pipe = _pipe(path, link, kind, partition, dtype)
        first = link.is_prefill and any(s.is_first for s in pipe.stages)
        try:
            generate_disaggregated(pipe, link, prompts[0] if first else None, NEW, 8, schedule="vpp-async")
            out[(fault, rank)] = ("no error", _left(pipe))
        except ValueError as exc:
            out[(fault, rank)] = (str(exc), _left(pipe))
    pipe = _pipe(paths["qwen3_moe"], link, kind, partition)
    first = link.is_prefill and any(s.is_first for s in pipe.stages)
    if link.is_prefill:
        pipe.prefill(prompts[0] if first else None, 8, schedule="vpp-async", request_ids=[5])
    hand_over(pipe, link, [5] if link.is_prefill else None, release=False)
    for fault, requests in (("twice", [5]), ("never prefilled", [6])):
        try:
            hand_over(pipe, link, requests if link.is_prefill else None)
            out[(fault, rank)] = ("no error", _left(pipe))
        except ValueError as exc:
            out[(fault, rank)] = (str(exc), _left(pipe))
    if link.is_prefill:  # the two prefill ranks name different requests
        pipe.prefill(prompts[1] if first else None, 8, schedule="vpp-async", request_ids=[6])
    for what, call in (("disagree", lambda: hand_over(pipe, link, [[5], [6]][rank] if link.is_prefill else None)),
                       ("save disagree", lambda: save_cache(pipe, [5, 6][rank], kv_dir))):
        if what == "save disagree" and not link.is_prefill:
            continue
        try:
            call()
            out[(what, rank)] = "no error"
        except ValueError as exc:
            out[(what, rank)] = str(exc)
    pipe.release(6)
    pipe.release(5)
    gen = generate_disaggregated(pipe, link, prompts if first else None, NEW, 8, schedule="vpp-async")
    out[("after the faults", rank)] = ([gen.tokens[0], gen.tokens[1]], link.role, _left(pipe))
    if link.is_prefill:  # NaN weights in layer 3 (stage 2, rank 1): the prefill fails on the prefill ranks
        for st in pipe.stages:
            for name, p in st.named_parameters():
                if name.startswith("model.layers.3.self_attn.o_proj"):
                    p.data.fill_(float("nan"))
    try:
        generate_disaggregated(pipe, link, prompts[0] if first else None, NEW, 8, schedule="vpp-async")
        out[("nan", rank)] = ("no error", "", _left(pipe))
    except Exception as exc:
        out[("nan", rank)] = (type(exc).__name__, str(exc), _left(pipe))
    if link.is_prefill:  # a decode step failing on rank 1 of the prefill instance's V
        out.update(_stopped_decode(rank, _pipe(paths["qwen3_moe"], link, kind, partition), prompts[0]))
    return out


def _stopped_decode(rank, pipe, prompt):
    """A decode step whose stage on rank 1 raises, then another decode step and a prefill."""
    out = pipe.prefill(prompt if rank == 0 else None, 8, schedule="vpp-async", request_ids=[8])
    token = pipe.next_logits(out, [8]).argmax(-1)
    if rank == 1:
        pipe.stages[0].decode = lambda x, requests: (_ for _ in ()).throw(RuntimeError("planted"))
    seen = {}
    for what, call in (("failed step", lambda: pipe.decode(token, [8])), ("next step", lambda: pipe.decode(token, [8])),
                       ("prefill", lambda: pipe.prefill(prompt if rank == 0 else None, 8, schedule="vpp-async"))):
        try:
            call()
            seen[(what, rank)] = "no error"
        except Exception as exc:
            seen[(what, rank)] = f"{type(exc).__name__}: {exc}"
    return seen


@pytest.fixture(scope="module")
def kv_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kv") / "mixed"


@pytest.fixture(scope="module")
def results(references, kv_dir):
    from vpp.parallel import run_distributed

    paths, prompts, _ = references
    merged = {}
    for r in run_distributed(_world, 3, paths, prompts, str(kv_dir), timeout=900):
        merged.update(r)
    return merged


def test_uneven_layouts_decode_as_transformers(references, results):
    _, _, tokens = references
    checked = 0
    for split, (sizes, _, _, models) in SPLITS.items():
        for name in models:
            want = [tokens[(name, 0)], tokens[(name, 1)]]
            for rank in range(3):
                got, role, left = results[(split, name, rank)]
                assert left == [[]] * len(left), (split, name, rank, left)  # nothing stays behind
                if role == "decode":
                    assert got == want, (split, name, rank)
                    checked += 1
                else:  # the prefill ranks know each request's first token
                    assert [t[:1] for t in got] == [t[:1] for t in want], (split, name, rank)
    assert checked == sum(len(m) * s[2] * s[3] for s, _, _, m in SPLITS.values())


def test_another_model_on_the_decode_instance_is_refused_everywhere(results):
    for fault, (_, _, _, message) in FAULTS.items():
        seen = {results[(fault, rank)][0] for rank in range(3)}
        assert len(seen) == 1, (fault, seen)  # the same error on every rank
        assert re.search(message, seen.pop()), fault
        for rank in range(3):
            left = results[(fault, rank)][1]
            assert left == [[]] * len(left), (fault, rank, left)  # neither instance keeps the caches


def test_a_request_handed_over_twice_or_never_prefilled_is_refused_everywhere(references, results):
    _, _, tokens = references
    for fault, message in (("twice", r"^request 5 already holds caches on the decode instance \(global rank 2\): "
                                     r"release it there before handing it over again$"),
                           ("never prefilled", r"^global rank 0: request 6 has no caches on this prefill rank to hand "
                                               r"over$")):
        seen = {results[(fault, rank)][0] for rank in range(3)}
        assert len(seen) == 1, (fault, seen)
        assert re.search(message, seen.pop()), fault
    assert results[("twice", 2)][1] == [[5]]  # the decode rank keeps what the first hand-over installed
    got, _, _ = results[("after the faults", 2)]
    assert got == [tokens[("qwen3_moe", 0)], tokens[("qwen3_moe", 1)]]


def test_prefill_ranks_naming_different_requests_are_refused_everywhere(results, kv_dir):
    """Before: the hand-over raised a bare KeyError; save_cache wrote request 5's layers from rank 0 and
    request 6's from rank 1 under one manifest, without a word."""
    handover = {results[("disagree", rank)] for rank in range(3)}
    assert handover == {"the prefill ranks disagree on the requests to hand over (request -> cached tokens): global "
                        "rank 0 gives {5: 37}, global rank 1 {6: 29}"}
    saved = {results[("save disagree", rank)] for rank in range(2)}
    assert saved == {"the ranks disagree on the request to save (request, cached tokens): global rank 0 gives "
                     "(5, 37), global rank 1 (6, 29)"}
    assert not (kv_dir / "manifest.json").exists()


def test_a_pipeline_stopped_in_a_decode_step_refuses_the_next_call(results):
    """Before: rank 0 had abandoned the receive of stage 3's input and rank 0's stage 0 held one token
    more than the others; the next decode step waited for a message the abandoned receive had taken
    (it timed out, naming rank 1, which was fine), where more messages per step would have shifted them."""
    assert results[("failed step", 1)] == "RuntimeError: planted"
    assert re.match(r"ExecutionError: pipeline rank 0 stopped at decode input of stage 3 because pipeline rank 1 "
                    r"\(global rank 1\) raised RuntimeError: planted", results[("failed step", 0)])
    for rank in (0, 1):
        for what in ("next step", "prefill"):
            assert re.match(rf"RuntimeError: this pipeline cannot run again on global rank {rank}: a decode step stopped "
                            r"in the middle of its transfers \(.*planted.*\); a transfer left behind would take the "
                            r"next one's place: start the ranks \(and their process groups\) anew$",
                            results[(what, rank)]), (what, rank, results[(what, rank)])


def test_a_failed_prefill_reaches_the_decode_instance(results):
    """Before: the prefill ranks raised NonFiniteError and never came to the hand-over; the decode ranks
    waited for it until their timeout (or a closed connection) and could not say why."""
    what = (r"non-finite values \(NaN or Inf\) in the prefill: the output of layer 3 in stage 2 \(layers \[3, 5\)\) "
            r"on pipeline rank 1 stopped being finite for request 0")
    for rank in range(3):
        kind, message, left = results[("nan", rank)]
        assert left == [[]] * len(left), (rank, left)
        if rank < 2:
            assert kind == "NonFiniteError" and re.match(what, message), (rank, kind, message)
        else:
            assert kind == "ValueError" and re.match("the prefill failed: NonFiniteError: " + what, message), message


def _dying(rank, world, path, prompt, out_dir):
    """Prefill rank 1 dies as it starts sending its caches; the others write what they saw."""
    import os

    import vpp.kv.handover as handover
    from vpp.parallel.instances import initialize_disaggregated

    link = initialize_disaggregated(1, 2, 1, 1)
    kind, partition = ("v", [1, 2, 2, 1]) if link.is_prefill else ("loop", None)
    pipe = _pipe(path, link, kind, partition)
    pipe.timeout_s = 20.0
    if link.is_prefill:
        pipe.prefill(prompt if link.groups.pp.rank == 0 else None, 8, schedule="vpp-async", request_ids=[5])
    if rank == 1:
        handover._send = lambda *a, **kw: os._exit(3)
    try:
        handover.hand_over(pipe, link, [5] if link.is_prefill else None)
        message = "finished"
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(message)


def test_a_rank_dying_in_the_hand_over_is_named(references, tmp_path):
    """The decode rank stops with one line naming the rank that died, in global ranks (before: "pipeline
    rank 2 ... pipeline rank 1", numbers that are global ranks of two instances)."""
    from vpp.parallel import run_distributed
    from vpp.parallel.spawn import RankFailure

    paths, prompts, _ = references
    with pytest.raises(RankFailure, match=r"rank 1 .*exited with code 3"):
        run_distributed(_dying, 3, paths["qwen3_moe"], prompts[0], str(tmp_path), timeout=300)
    message = (tmp_path / "rank2").read_text()
    assert "\n" not in message
    assert re.match(r"ExecutionError: global rank 2 gave up at receiving model.layers.\d.self_attn.[kv] of request 5 "
                    r"from global rank 1: global rank 1 stopped responding \(", message), message
