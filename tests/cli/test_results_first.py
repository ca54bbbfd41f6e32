"""Results before extras: when the --trace folder becomes unwritable during the run, the measured table and
the --save-logits file are still written, and the failure is one line (exit 1). In-process, one rank."""

from __future__ import annotations

import shutil

import pytest

from vpp import cli
from vpp.cli import prefill, prefill_rounds
from vpp.parallel.groups import ParallelGroups


def test_unwritable_trace_folder_loses_no_result(tmp_path, capsys, monkeypatch):
    trace, logits = tmp_path / "trace", tmp_path / "logits.safetensors"
    trace.mkdir()
    cfg = prefill_rounds.BenchConfig(model="toy", pp=1, seq_len=32, chunk_size=16, schedules=("cpp",), repeat=1,
                                     warmup=False, pin=False, partition="even", trace_dir=str(trace),
                                     save_logits=str(logits))
    rows, facts = prefill_rounds.run_bench(ParallelGroups.single(), cfg)
    shutil.rmtree(trace)
    trace.write_text("not a folder any more")  # the folder became unwritable mid-run
    with pytest.raises(RuntimeError) as caught:
        prefill.report(rows, facts, cfg, as_json=False, atol=1e-3)
    out, err = capsys.readouterr()
    assert "| cpp |" in out  # the measured table
    assert logits.stat().st_size > 0 and f"wrote {logits}" in err
    assert trace.read_text() == "not a folder any more"
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and message.startswith(f"--trace {trace}: the traces were not written")
    assert cli._summary(caught.value) == message
