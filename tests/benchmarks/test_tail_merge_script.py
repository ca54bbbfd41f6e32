"""``benchmarks/tail_merge.py --quick``: the tail-merging table's every step at one model, two lengths
and one budget (seconds, in-process), checked against what the planners give for those cells."""

from benchmarks import tail_merge


def test_tail_merge_quick_run(capsys):
    assert tail_merge.main(["--quick", "--out", ""]) == 0
    out = capsys.readouterr().out
    assert "of 6 cells have a final chunk below budget // 4" in out and "## Threshold: 512" in out
    # CPP at 64K / 24K leaves a 16K tail (not below 6K): never merged
    assert "| deepseek-v3.1 | cpp |" not in out
