"""Every ``vpp`` command the README shows parses as written (flags exist, values are valid); the
slow tier and the session notes run them. No process is started here."""

import pathlib
import re
import shlex

import pytest

from vpp import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    found = re.findall(r"`((?:torchrun [^`]*?-m )?vpp [a-z-]+[^`]*)`", text)
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        found += [line.split("&&")[-1].strip() for line in block.splitlines() if re.search(r"(^|&& )vpp ", line)]
    out = []
    for cmd in found:
        cmd = cmd.split("-m vpp ", 1)[-1] if "-m vpp " in cmd else cmd.split("vpp ", 1)[1]
        words = cmd.split()
        if words[0] in cli.COMMANDS and len(words) > 1 and not any(w.isupper() for w in words):
            out.append(cmd)  # a bare name (a table's first column) or a placeholder (N, DIR) is not a command
    return sorted(set(out))


def test_the_readme_gives_an_example_of_every_command():
    shown = {c.split()[0] for c in _commands()}
    assert shown == set(cli.COMMANDS), sorted(set(cli.COMMANDS) - shown)


@pytest.mark.parametrize("command", _commands())
def test_readme_command_parses(command):
    args = cli.build_parser().parse_args(shlex.split(command))
    assert args.command == command.split()[0]
