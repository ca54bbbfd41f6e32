"""``vpp --version`` and ``vpp --help`` answer without importing torch (nor numpy and the schedules: no
command module is imported), and a command's ``--help`` without torch: checked on the modules a fresh
interpreter holds afterwards, never with a timing."""

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
import json, sys
from vpp.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": [m for m in ("torch", "numpy", "vpp.schedules") if m in sys.modules]}))
"""


def _loaded(*argv) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120, env=env)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["code"] in (0, None), proc.stderr
    return out["loaded"]


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_version_and_help_import_no_command(argv):
    assert _loaded(*argv) == []


@pytest.mark.parametrize("command", ["prefill", "generate", "serve-bench", "simulate", "serve-sim", "calibrate", "tune"])
def test_a_commands_help_imports_no_torch(command):
    assert "torch" not in _loaded(command, "--help")
