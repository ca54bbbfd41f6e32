"""The README's API snippet runs as written, and the test command CI runs is the README's."""

import pytest
import pathlib
import re
import subprocess
import sys

pytestmark = pytest.mark.slow  # every test here starts processes

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _block_after(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    tail = text[text.index(marker):]
    return re.search(r"```(?:python|bash)\n(.*?)```", tail, re.S).group(1)


def test_readme_snippet_runs(tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(_block_after("<!-- readme-snippet"))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"next token \d+ bubble ratio 0\.\d+", proc.stdout), proc.stdout


def test_ci_runs_the_readme_test_command():
    command = _block_after("<!-- test-command").strip()
    assert command.endswith("python -m pytest")
    shown = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--print"], capture_output=True, text=True,
                           cwd=ROOT, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == command
