"""A run's layout is chosen once (vpp.models.run_layout.layout_for), in the command's own process, and
passed down to the ranks; the layout the executed plan ran on (inferred from the stage modules) is
checked against it."""

import pytest

from vpp.cli import build_parser
from vpp.models import run_layout
from vpp.models.registry import open_model
from vpp.runtime.layout_inference import check_agrees
from vpp.schedules import make_layout


@pytest.fixture
def choices(monkeypatch):
    """Every layout_for call: (schedule, partition)."""
    seen = []
    real = run_layout.layout_for

    def counting(model, schedule, pp, folds=1, **kw):
        seen.append((schedule, kw.get("partition", "even")))
        return real(model, schedule, pp, folds, **kw)
    monkeypatch.setattr(run_layout, "layout_for", counting)
    return seen


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_prefill_chooses_each_layout_once_and_hands_it_to_the_ranks(choices):
    from vpp.cli import prefill
    args = parse("prefill", "--model", "toy", "--seq-len", "512", "--chunk-size", "128")
    prefill.check(args)
    assert choices == [("cpp", "rank"), ("vpp", "rank"), ("vpp-async", "rank")]
    model = open_model("toy")
    assert args.layouts == {s: run_layout.layout_for(model, s, 2, chunk=128, seq_len=512, partition="rank")
                            for s in ("cpp", "vpp", "vpp-async")}
    assert prefill._config(args).layouts is args.layouts


def test_serve_bench_chooses_every_contenders_layout_once(choices):
    from vpp.cli import serve_bench
    args = parse("serve-bench", "--model", "toy", "--workload", "short", "--n", "2", "--scale", "1024",
                 "--chunk-size", "4", "--contenders", "cpp,vpp-async,gpipe")
    serve_bench.check(args)
    assert sorted(choices) == [("cpp", "even"), ("gpipe", "even"), ("vpp-async", "even")]
    assert set(args.cfg.layouts) == {"cpp", "vpp-async", "gpipe"}
    assert args.cfg.layouts["vpp-async"].kind == "v" and args.cfg.layouts["gpipe"].kind == "loop"


def test_generate_chooses_its_layouts_once(choices):
    from vpp.cli import generate
    args = parse("generate", "--model", "tiny-deepseek", "--pp", "2", "--schedule", "vpp", "--seq-len", "16",
                 "--max-new-tokens", "2", "--decode-tp", "1")
    generate.check(args)
    assert choices == [("vpp", "even"), ("cpp", "even")]
    assert args.job.layout.kind == "v" and args.job.decode_layout.kind == "loop"
    assert "layout" not in generate._config(args.job)


def test_an_inferred_layout_other_than_the_chosen_one_raises():
    chosen, other = make_layout("v", 8, 2), make_layout("v", 8, 2, partition=[1, 3, 3, 1])
    check_agrees(chosen, make_layout("v", 8, 2))
    with pytest.raises(ValueError, match=r"vpp prefill: the stage modules form .* \(layers \[\(0, 1\), \(1, 4\)"):
        check_agrees(chosen, other, "vpp prefill")
