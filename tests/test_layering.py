"""The arrows between the rooms (README "Layout"), as import-linter contracts in pyproject.toml."""

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_import_contracts_hold(capsys):
    cli = pytest.importorskip("importlinter.cli")
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        code = cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    finally:
        os.chdir(here)
    out = capsys.readouterr().out
    assert code == 0, out[-4000:]
    assert "0 broken" in out


def test_only_the_cli_prints():
    """Library code logs; only vpp/cli writes to the terminal."""
    offenders = []
    for path in (ROOT / "vpp").rglob("*.py"):
        if path.parent.name == "cli":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "print(" in line.split("#")[0]:
                offenders.append(f"{path.relative_to(ROOT)}:{n}")
    assert offenders == []
