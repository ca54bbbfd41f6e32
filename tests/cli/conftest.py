"""What several tests of the commands read: a run of a command, each test checking its own output of
it, and a checkpoint built once."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class CppPrefill:
    printed: dict  # the --json object
    link: Path  # --save-logits was given this symlink
    target: Path  # ... to this regular file, which held b"old" before the run


@pytest.fixture(scope="session")
def cpp_prefill(tmp_path_factory) -> CppPrefill:
    """``vpp prefill --json --save-logits LINK`` on the default model's CPP, in this process on spawned
    ranks, once: tests/cli/test_memory_plan.py reads the printed memory plan, tests/cli/test_output_paths.py
    the logits written through the symlink."""
    from vpp import cli
    tmp = tmp_path_factory.mktemp("cpp-prefill")
    target, link = tmp / "real.safetensors", tmp / "link.safetensors"
    target.write_bytes(b"old")
    link.symlink_to(target)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert cli.main(["prefill", "--json", "--seq-len", "512", "--chunk-size", "128", "--schedule", "cpp",
                         "--repeat", "1", "--no-warmup", "--no-progress", "--device", "cpu",
                         "--save-logits", str(link)]) == 0
    return CppPrefill(json.loads(out.getvalue()), link, target)


@pytest.fixture(scope="session")
def fp8_case(tmp_path_factory):
    """A tiny DeepSeek-V3 FP8 checkpoint in the official layout, with its dequantized twin
    (tests/models/fp8_tiny.py): ``vpp prefill`` (test_prefill_cli) and examples/deepseek_prefill.py
    (test_examples) run it."""
    from tests.models.fp8_tiny import make_fp8_case
    return make_fp8_case("deepseek_v3", tmp_path_factory.mktemp("fp8"))
