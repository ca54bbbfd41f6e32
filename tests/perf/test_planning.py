"""Taper planner, auto-tuner, memory model and the `vpp tune` command."""

import pytest

from vpp.cli import main
from vpp.perf.arch import Arch
from vpp.perf.rank_memory import kv_bytes_per_token_layer, layer_weight_bytes, rank_memory, working_set
from vpp.perf.ops import Parallel
from vpp.perf.runs import Setup, run
from vpp.perf.taper import best_taper, tapered_sizes
from vpp.perf.deployment_search import Candidate, evaluate, paper_best, tune

from tests.perf.archs import DEV, TINY_GQA, TINY_MLA


def test_tapered_sizes():
    assert tapered_sizes(10000, 4096) == [4096, 4096, 1808]
    assert tapered_sizes(20480, 4096, (0.25, 0.75), (0.5, 0.25, 0.25)) == [1024, 3072, 4096, 4096, 4096, 2048, 1024, 1024]
    s = tapered_sizes(20480, 4096, (0.25, 0.75), (0.5, 0.25, 0.25))
    assert sum(s) == 20480
    assert tapered_sizes(3000, 4096, (0.5, 0.5), (0.5, 0.5)) == [3000]          # ramps do not fit: plain
    calls = []
    sizes, head, tail, score = best_taper(lambda s: calls.append(s) or len(s), 40000, 4096)
    assert score == min(len(c) for c in calls) and sizes == tapered_sizes(40000, 4096, head, tail)


def tiny_setup(layers=4, pp=2) -> Setup:
    cfg = {**TINY_MLA, "num_hidden_layers": layers}
    return Setup(Arch.from_config(cfg, name="tiny"), DEV, Parallel(tp=2, weight_bytes=1), pp)


def test_tune_ranks_and_includes_the_paper_config():
    setup = tiny_setup(8)
    ranked = tune(setup, 4096, chunks=(512, 1024), max_folds=2, taper_top=1)
    ttfts = [r.ttft for r in ranked]
    assert ttfts == sorted(ttfts)
    base = paper_best(setup, 4096, chunks=(512, 1024))
    assert ranked[0].ttft <= base.ttft
    assert any(r.candidate == base.candidate for r in ranked)
    kinds = {r.candidate.kind for r in ranked}
    assert kinds == {"loop", "v", "interleaved"}
    assert any(r.candidate.chunking == "dcpp" for r in ranked)
    r = evaluate(setup, Candidate("v", 1, "balanced", 512, "async"), 4096)
    assert r.ttft > 0 and r.chunks == 8


def test_memory_by_hand():
    arch = Arch.from_config(TINY_MLA)
    par = Parallel(tp=2, weight_bytes=1)
    assert kv_bytes_per_token_layer(arch, par) == (16 + 4) * 2                 # MLA latent, same on every rank
    assert kv_bytes_per_token_layer(Arch.from_config(TINY_GQA), par) == 2 * 1 * 16 * 2   # 1 KV head per rank
    # dense layer 0: q_a 64x32 + q_b 32x(2x12) + kv_a 64x20 + o 16x64 (int8) + kv_b 16x(2x16) (bf16) + MLP 3x64x24
    want = (64 * 32 + 32 * 24 + 64 * 20 + 16 * 64) * 1 + 16 * 32 * 2 + 3 * 64 * 24 * 1
    assert layer_weight_bytes(arch, 0, par) == want
    assert working_set(arch, par, 4, 0) == 4 * 4 * 64 * 2 + 4 * 2 / 2 * 3 * 16 * 2


def test_activation_peak_async_holds_more():
    setup = tiny_setup()
    mems = {}
    for strategy in ("cpp", "vpp", "vpp-async"):
        r = run(setup, strategy, [4096], 512)
        mems[strategy] = rank_memory(r.plan, r.trace, r.cost)
        assert all(m.kv_cache == 4096 * 2 * 40 for m in mems[strategy])      # 2 layers per rank, 40 B/token
        assert all(m.activations > 0 and m.weights > 0 for m in mems[strategy])
    assert max(m.activations for m in mems["vpp-async"]) >= max(m.activations for m in mems["vpp"])


def test_cli_tune(capsys):
    assert main(["tune", "--model", "deepseek", "--length", "32768", "--chunks", "8192,16384", "--max-folds", "1",
                 "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "paper's best configuration" in out and "deepseek" in out


def test_tune_regroups_the_devices_for_context_parallelism():
    setup = tiny_setup(8)                                       # tp=2 x pp=2: 4 devices
    ranked = tune(setup, 4096, chunks=(512, 1024), max_folds=1, taper_top=0)
    cps = {(r.candidate.cp, r.candidate.pp, r.candidate.kind) for r in ranked if r.candidate.cp > 1}
    assert cps == {(2, 1, "loop"), (4, 1, "loop"), (2, 2, "v")}   # CP2 x TP2, CP4 x TP1, V x CP2 x TP1
    cand = next(r.candidate for r in ranked if r.candidate.cp == 4)
    direct = run(Setup(setup.arch, setup.device, Parallel(tp=1, weight_bytes=1), 1, cp=4), "cpp", [4096], cand.chunk)
    assert evaluate(setup, cand, 4096).ttft == pytest.approx(direct.row.total)
    assert all(r.memory > 0 for r in ranked)
    assert not any(r.candidate.cp > 1 for r in tune(setup, 4096, chunks=(512,), max_folds=1, taper_top=0, cp=False))
