"""``vpp --version`` and ``vpp --help`` answer without importing torch (nor numpy and the schedules: no
command module is imported), and a command's ``--help`` without torch: checked on the modules a fresh
interpreter holds afterwards, never with a timing.

One fresh interpreter (not ten) answers every call in turn and reports what is loaded after each:
modules stay loaded, so the call that imports one fails and so does every call after it; the first
failure names the culprit. The calls that must import nothing run first."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every test here starts a process

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROBE = """
import contextlib, io, json, sys
from vpp.cli import main
reports = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    reports.append({"argv": argv, "code": code,
                    "loaded": [m for m in ("torch", "numpy", "vpp.schedules") if m in sys.modules]})
print(json.dumps(reports))
"""
BARE = [["--version"], ["--help"], []]
COMMANDS = ["prefill", "generate", "serve-bench", "simulate", "serve-sim", "calibrate", "tune"]


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    """' '.join(argv) -> the modules loaded after that call (and every call before it)."""
    calls = BARE + [[command, "--help"] for command in COMMANDS]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(calls)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["argv"] for r in reports] == calls
    for r in reports:
        assert r["code"] in (0, None), r
    return {" ".join(r["argv"]): r["loaded"] for r in reports}


@pytest.mark.parametrize("argv", BARE)
def test_version_and_help_import_no_command(argv, loaded):
    assert loaded[" ".join(argv)] == []


@pytest.mark.parametrize("command", COMMANDS)
def test_a_commands_help_imports_no_torch(command, loaded):
    assert "torch" not in loaded[f"{command} --help"]
