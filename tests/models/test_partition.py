"""How real runs cut a model into stages (vpp.models.run_layout): balanced per rank on the cost model."""

import pytest

from vpp.models.run_layout import choose_partition, layer_costs
from vpp.models.registry import open_model, snap_partition
from vpp.schedules import rank_loads
from vpp.schedules.layout import stage_ranks_for


@pytest.mark.parametrize("name", ["tiny-deepseek", "tiny-qwen", "tiny-glm"])
@pytest.mark.parametrize("kind", ["loop", "v"])
def test_heaviest_rank_no_worse_than_the_even_split(name, kind):
    model = open_model(name)
    costs, embed, head = layer_costs(model.config, chunk=1024, seq_len=16384)
    ranks = stage_ranks_for(kind, 2)
    part = choose_partition(model, kind, 2, chunk=1024, seq_len=16384)
    even = snap_partition(model.num_layers, len(ranks), model.stage_starts)
    load = lambda p: max(rank_loads(p, costs, ranks, embed_cost=embed, head_cost=head))
    assert load(part) <= load(even) * (1 + 1e-12)
    starts = [sum(part[:i]) for i in range(len(part))]
    assert set(starts) <= set(model.stage_starts)          # tiny-glm's shared-indexer layers stay together


def test_even_on_request_and_for_models_without_a_cost_view():
    model = open_model("tiny-deepseek")
    assert choose_partition(model, "v", 2, chunk=512, seq_len=4096, how="even") == snap_partition(6, 4, model.stage_starts)
    toy = open_model("toy")
    assert choose_partition(toy, "v", 2, chunk=512, seq_len=4096) == snap_partition(8, 4, toy.stage_starts)
    with pytest.raises(ValueError, match="partition='bad'"):
        choose_partition(model, "v", 2, chunk=512, seq_len=4096, how="bad")


def test_given_the_schedule_the_v_keeps_its_drain_short():
    """tiny-deepseek, 8K tokens in 1K chunks: per chunk, 1/1/2/2 and 2/1/2/1 load both ranks alike (three
    layers each), and the per-rank balancer keeps 1/1/2/2 (its dense first layer makes 1/1/2/2's stages
    the more even); over the whole prompt 2/1/2/1 ends sooner under VPP-Async, since one layer instead of
    two runs alone at the end, on the most expensive chunk. CPP's even split stays."""
    model = open_model("tiny-deepseek")
    costs, embed, head = layer_costs(model.config, chunk=1024, seq_len=8192)
    ranks = stage_ranks_for("v", 2)
    snapshot = choose_partition(model, "v", 2, chunk=1024, seq_len=8192)
    whole = choose_partition(model, "v", 2, chunk=1024, seq_len=8192, schedule="vpp-async")
    assert snapshot == [1, 1, 2, 2] and whole == [2, 1, 2, 1]
    load = lambda p: max(rank_loads(p, costs, ranks, embed_cost=embed, head_cost=head))
    assert load(whole) <= load(snapshot) * 1.005
    assert choose_partition(model, "loop", 2, chunk=1024, seq_len=8192, schedule="cpp") == [3, 3]
    assert choose_partition(model, "v", 2, chunk=1024, seq_len=8192, how="even", schedule="vpp-async") == \
        snap_partition(6, 4, model.stage_starts)


def test_the_prefill_defaults_show_the_v_on_the_cost_model():
    """Why ``vpp prefill`` defaults to 8192 tokens in chunks of 2048: on the cost model (the cpu preset),
    VPP-Async with its chosen partition takes at most 0.90 of CPP's makespan there, less than at 8
    chunks of 1024 or 16 of 1024 (the V gains its shorter drain and fill, a share that shrinks as the
    chunks multiply)."""
    from vpp.models.run_layout import ChunkTime
    from vpp.cli.prefill import DEFAULT_CHUNK, DEFAULT_SEQ_LEN
    from vpp.schedules.drain_balance import simulated_makespans
    model = open_model("tiny-deepseek")
    time_of = ChunkTime(model.config)

    def ratio(seq_len, chunk):
        out = []
        for schedule, kind in (("cpp", "loop"), ("vpp-async", "v")):
            part = choose_partition(model, kind, 2, chunk=chunk, seq_len=seq_len, schedule=schedule)
            out += simulated_makespans(schedule, kind, 2, [part], [chunk] * (seq_len // chunk), time_of.layer,
                                       embed_time=time_of.embed, head_time=time_of.head)
        return out[1] / out[0]

    default = ratio(DEFAULT_SEQ_LEN, DEFAULT_CHUNK)
    assert default <= 0.90
    assert default < ratio(8192, 1024) < ratio(16384, 1024)
