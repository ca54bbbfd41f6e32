"""The commands that run on ranks take their options through torchrun's own parser
(``torchrun ... -m vpp COMMAND OPTIONS``): argparse there refuses an option that abbreviates one of
torchrun's (``--n`` could be ``--nnodes`` or ``--nproc-per-node``), so every option needs one spelling
that reaches vpp unchanged. No process: torch's parser is called directly."""

from __future__ import annotations

import argparse

import pytest
from torch.distributed.run import get_args_parser

from vpp import cli

RANK_COMMANDS = ("prefill", "generate", "serve-bench")  # the commands README runs under torchrun


def _options(command: str) -> list[argparse.Action]:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices[command]._actions if a.option_strings and a.dest != "help"]


def _reaches_vpp(words: list[str]) -> bool:
    try:
        parsed = get_args_parser().parse_args(["--standalone", "--nproc-per-node=2", "-m", "vpp", *words])
    except SystemExit:
        return False
    return parsed.training_script_args == words


@pytest.mark.parametrize("command", RANK_COMMANDS)
def test_every_option_has_a_spelling_torchrun_passes_on(command, capsys):
    refused = []
    for action in _options(command):
        value = [] if action.nargs == 0 else ["1"]
        if not any(_reaches_vpp([command, option, *value]) for option in action.option_strings):
            refused.append("/".join(action.option_strings))
    capsys.readouterr()  # torchrun's parser printed its usage for each refusal
    assert not refused, f"torchrun refuses every spelling of {refused}"


def test_serve_bench_requests_is_n():
    args = cli.build_parser().parse_args(["serve-bench", "--workload", "short", "--requests", "4"])
    assert args.n == 4
