"""Every Python block of the README runs as written (the API snippet, the Pipeline loop), and the test
command CI runs is the README's."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every test here starts processes

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _block_after(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    tail = text[text.index(marker):]
    return re.search(r"```(?:python|bash)\n(.*?)```", tail, re.S).group(1)


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _run_block(tmp_path, block: str) -> str:
    script = tmp_path / "snippet.py"
    script.write_text(block)
    # a script's own directory comes first on its sys.path, not the cwd: point it at this checkout's vpp
    # (not whichever checkout an editable install names)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_readme_snippet_runs(tmp_path):
    out = _run_block(tmp_path, _block_after("<!-- readme-snippet"))
    assert re.search(r"next token \d+ bubble ratio 0\.\d+", out), out


# what each block prints, by a phrase of its code: a block added without a line here fails the count below
PRINTS = {"forward_vpp_prefill(": r"next token \d+ bubble ratio 0\.\d+",
          "pipe.next_logits(": r"sampled \[(\d+, ){7}\d+\] TTFT [\d.]+ s greedy \[\d+, \d+\]"}


def test_every_readme_python_block_is_known():
    blocks = _python_blocks()
    assert len(blocks) == len(PRINTS) and all(sum(k in b for k in PRINTS) == 1 for b in blocks), \
        f"{len(blocks)} python blocks in the README, {len(PRINTS)} in PRINTS: add the new one's output"


@pytest.mark.parametrize("phrase", [k for k in PRINTS if k != "forward_vpp_prefill("])  # that one: above
def test_every_readme_python_block_runs(tmp_path, phrase):
    block = next(b for b in _python_blocks() if phrase in b)
    out = _run_block(tmp_path, block)
    assert re.search(PRINTS[phrase], out), out


def test_ci_runs_the_readme_test_command():
    command = _block_after("<!-- test-command").strip()
    assert command.endswith("python -m pytest")
    shown = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--print"], capture_output=True, text=True,
                           cwd=ROOT, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == command
