"""The CLI explains itself: bare ``vpp`` lists the commands, ``--version`` works, every option of every
command has a help text (and ``--help`` shows its default)."""

import argparse

import pytest

from vpp import __version__
from vpp import cli


def _commands():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_bare_vpp_lists_the_commands(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert name in out


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"vpp {__version__}"


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_option_has_help_and_its_default_shows(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping inside a default such as tiny-deepseek
    parser = _commands()[command]
    missing = [a.option_strings or [a.dest] for a in parser._actions
               if not isinstance(a, argparse._HelpAction) and not a.help]
    assert missing == [], f"vpp {command}: options without help: {missing}"
    text = parser.format_help()
    for a in parser._actions:
        if a.option_strings and a.default not in (None, False, argparse.SUPPRESS) and a.help \
                and "default" not in a.help:
            assert f"(default: {a.default})" in text, (command, a.option_strings)
