"""``launch`` returns the same shape spawned and under torchrun: a list indexed by global rank, one
entry per rank (spawned: every value; under torchrun each process its own, None elsewhere)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every test here starts processes

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = """
import json
import sys
from vpp.parallel import launch


def value(rank, world):
    return {"rank": rank, "world": world}


if __name__ == "__main__":
    # one write: torchrun's ranks write unbuffered to one pipe, and print's pieces would interleave
    sys.stdout.write("RESULT " + json.dumps(launch(value, 2)) + "\\n")
    sys.stdout.flush()
"""


def _results(tmp_path, *launcher) -> list:
    script = tmp_path / "shape.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, *launcher, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(m) for m in re.findall(r"^RESULT (.*)$", proc.stdout, re.M)]


def test_spawned_launch_returns_every_ranks_value_by_global_rank(tmp_path):
    assert _results(tmp_path) == [[{"rank": 0, "world": 2}, {"rank": 1, "world": 2}]]


def test_torchrun_launch_returns_the_same_shape_with_its_own_value(tmp_path):
    got = sorted(_results(tmp_path, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"),
                 key=lambda out: out[0] is None)
    assert got == [[{"rank": 0, "world": 2}, None], [None, {"rank": 1, "world": 2}]]
