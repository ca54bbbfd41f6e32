"""``vpp prefill`` under torchrun on two "nodes": two torchrun launchers on this machine, one rank each,
meeting at a static rendezvous on a free localhost port (``--nnodes 2 --node-rank {0,1}``), as a
cluster runs it. Each launcher runs in a session of its own, so that everything it started (its
rank included, even once orphaned) is killed when a case ends, passed or failed.

Failures that only several nodes show: an argument that differs between the nodes (each node parses
its own command line), a rank that fails its checks while the other node waits at the start, a rank
killed while the other node waits for it (torchrun stops the dead rank's node only), and a node whose
launcher is killed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runtime.fault_job import HEARTBEAT

pytestmark = pytest.mark.slow  # every test here starts processes

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "runtime" / "fault_job.py"
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
# start-up of two launchers and two interpreters importing torch on a loaded 2-core machine (three runs
# at once for the deaths below), then a toy run of a few seconds; a rank that waited out the start-up
# timeout (300 s) would pass this bound
BOUND_S = 120.0
PREFILL = ["prefill", "--model", "toy", "--pp", "2", "--chunk-size", "16", "--repeat", "1", "--no-warmup",
           "--schedule", "vpp", "--timeout", "30"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TwoNodes:
    """Two torchrun launchers (node ranks 0 and 1) running ``python PROGRAM ARGS`` (``-m vpp`` unless
    told) with one rank each."""

    def __init__(self, tmp: Path, args0: list[str], args1: list[str], program: tuple[str, ...] = ("-m", "vpp"),
                 cwd: tuple[Path, Path] = (ROOT, ROOT)):
        port, self.tmp, self.procs = _free_port(), tmp, []
        self.deadline = time.monotonic() + BOUND_S
        for node, args in enumerate((args0, args1)):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                   "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
                   *program, *args]
            with open(tmp / f"out{node}", "w") as out, open(tmp / f"err{node}", "w") as err:
                self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=ENV, cwd=cwd[node],
                                                   start_new_session=True))

    def wait(self) -> list[int]:
        """Both launchers' exit codes, once both ended, within BOUND_S of their start."""
        return [p.wait(timeout=max(1.0, self.deadline - time.monotonic())) for p in self.procs]

    def err(self, node: int) -> str:
        return (self.tmp / f"err{node}").read_text()

    def stop(self) -> None:
        """Kill both sessions (launchers, ranks, orphans) and reap the launchers."""
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def nodes(tmp_path):
    started: list[TwoNodes] = []

    def start(args0, args1, program=("-m", "vpp"), cwd=(ROOT, ROOT)) -> TwoNodes:
        started.append(TwoNodes(tmp_path, args0, args1, program, cwd))
        return started[-1]
    yield start
    for n in started:
        n.stop()


def _selected(request, name: str) -> bool:
    """Whether this session runs the test ``name`` of the requesting module."""
    return any(item.module is request.module and getattr(item, "originalname", item.name) == name
               for item in request.session.items)


def _checkpoints(tmp: Path) -> tuple[Path, Path]:
    """Two working directories whose ``model`` holds checkpoints of the same shapes, other weights."""
    from vpp.models import random_checkpoint, save_checkpoint
    from vpp.models.tiny import TINY_CONFIGS
    cfg = TINY_CONFIGS["tiny-qwen"]
    for node, seed in (("a", 0), ("b", 1)):
        save_checkpoint(cfg, random_checkpoint(cfg, seed), tmp / node / "model")
    return tmp / "a", tmp / "b"


@pytest.fixture(scope="module")
def early(request, tmp_path_factory):
    """The runs of the three tests below that fail at the start (those selected, by test name), started
    at once: each mostly waits (the stopped rank's grace, the launchers stopping), and the waits overlap."""
    runs = {}
    name = "test_an_argument_that_differs_between_nodes_fails_every_rank_naming_it"
    if _selected(request, name):
        runs[name] = TwoNodes(tmp_path_factory.mktemp("differs"), [*PREFILL, "--seq-len", "64"],
                              [*PREFILL, "--seq-len", "128"])
    name = "test_the_same_model_path_holding_other_checkpoints_fails_every_rank_naming_it"
    if _selected(request, name):
        tmp = tmp_path_factory.mktemp("checkpoints")
        args = ["prefill", "--model", "model", "--pp", "2", "--seq-len", "32", "--chunk-size", "16", "--repeat", "1",
                "--no-warmup", "--schedule", "cpp", "--timeout", "30"]
        runs[name] = TwoNodes(tmp, args, args, cwd=_checkpoints(tmp))
    name = "test_a_rank_that_fails_its_checks_stops_the_other_node_at_the_start"
    if _selected(request, name):
        runs[name] = TwoNodes(tmp_path_factory.mktemp("checks"), [*PREFILL, "--seq-len", "64"],
                              [*PREFILL, "--seq-len", "64", "--cached-prefix", "64"])
    yield runs
    for run in runs.values():
        run.stop()


def test_an_argument_that_differs_between_nodes_fails_every_rank_naming_it(early):
    """``--seq-len`` 64 on node 0, 128 on node 1. Before: the ranks ran with different prompts (a layout
    that differs, a confusing pipeline error, or, with the same layout, a run that silently reported
    node 0's prompt length)."""
    run = early["test_an_argument_that_differs_between_nodes_fails_every_rank_naming_it"]
    codes = run.wait()
    assert codes[0] != 0 and codes[1] != 0, (run.err(0)[-2000:], run.err(1)[-2000:])
    said = ("vpp prefill: error: global rank(s) [1] of 2 were started with other arguments than global rank 0: "
            "global rank 1 has --seq-len 128 (global rank 0: 64)")
    for node in (0, 1):
        assert said in run.err(node), run.err(node)[-2000:]


def test_the_same_model_path_holding_other_checkpoints_fails_every_rank_naming_it(early):
    """``--model model`` on both nodes, resolving to checkpoints of the same shapes with other weights.
    Before: exit 0 with logits off by up to 4.9 (or, with other widths, SIGABRT in gloo naming no model)."""
    from vpp.models.safetensors_files import checkpoint_digest
    run = early["test_the_same_model_path_holding_other_checkpoints_fails_every_rank_naming_it"]
    codes = run.wait()
    assert codes[0] != 0 and codes[1] != 0, (run.err(0)[-2000:], run.err(1)[-2000:])
    digest = {n: checkpoint_digest(run.tmp / n / "model") for n in "ab"}
    said = (f"global rank 1 has --model 'model (checkpoint digest {digest['b']})' (global rank 0: 'model "
            f"(checkpoint digest {digest['a']})')")
    for node in (0, 1):
        assert said in run.err(node), run.err(node)[-2000:]


def test_a_rank_that_fails_its_checks_stops_the_other_node_at_the_start(early):
    """Node 1's rank refuses its arguments (``--cached-prefix`` as long as the prompt) before it joins;
    node 0's rank, waiting at the start-up rendezvous, stops at once naming it (before: it waited out
    the 300 s start-up timeout)."""
    run = early["test_a_rank_that_fails_its_checks_stops_the_other_node_at_the_start"]
    codes = run.wait()
    assert codes[0] != 0 and codes[1] != 0
    own = "vpp prefill: error: --cached-prefix 64 leaves nothing to prefill of a 64-token prompt"
    assert own in run.err(1), run.err(1)[-2000:]
    assert f"vpp prefill: error: global rank 1 failed before the ranks started: {own}" in run.err(0), \
        run.err(0)[-2000:]


DEATHS = ("die-loading", "die-groups", "die-collective")  # fault_job.py's modes that SIGKILL node 1's rank


@pytest.fixture(scope="module")
def deaths(request, tmp_path_factory):
    """The runs of the test below that its selected cases read (``{mode: TwoNodes}``), all started at
    once: each mostly waits (for a silent heartbeat, a blocked rank's grace, the launchers stopping), and
    their waits overlap instead of adding up."""
    wanted = {item.callspec.params["mode"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")
              and item.callspec.params.get("mode") in DEATHS}
    runs = {}
    for mode in sorted(wanted):
        out = tmp_path_factory.mktemp(mode)
        runs[mode] = TwoNodes(out, [mode, "300", str(out)], [mode, "300", str(out)], program=(str(JOB),))
    yield runs
    for run in runs.values():
        run.stop()


@pytest.mark.parametrize("mode,said", [
    ("die-loading", "global rank 0 stopped at the start-up exchange because global rank 1 died while running its "
                    "work, after the process group was created (no heartbeat for "),
    ("die-groups", "ending it: global rank 1 died while running its work, after the process group was created"),
    ("die-collective", "RankFailure: global rank 1 died while running its work, after the process group was created "
                       f"(no heartbeat for {3 * HEARTBEAT['beat_s']:g}s); global rank 0 lost it: RuntimeError: "),
], ids=["die-loading", "die-groups", "die-collective"])
def test_a_rank_killed_at_the_start_stops_the_other_node_naming_it(deaths, mode, said):
    """Node 1's rank is SIGKILLed once the ranks met: after building its stages while node 0's waits for
    it at the start-up exchange (as for a peer loading a checkpoint), or while node 0's rank creates the
    model-parallel groups with it (blocked inside torch), or while node 0's rank waits for it in a
    collective. torchrun stops node 1 only; before, node 0's rank waited out the exchange's or the
    process group's timeout (300 s here, past BOUND_S), or failed at once with gloo's "Connection reset
    by peer [address]", naming no rank. Now the dead rank's silent heartbeat ends it within seconds,
    naming rank 1 and what it was doing (the job beats faster than the library by default:
    ``fault_job.HEARTBEAT``)."""
    run = deaths[mode]
    codes = run.wait()
    assert codes[0] != 0 and codes[1] != 0, (run.err(0)[-2000:], run.err(1)[-2000:])
    assert said in run.err(0), run.err(0)[-3000:]


def test_a_rank_dies_with_its_torchrun(nodes):
    """SIGKILL of node 1's launcher mid-run: its rank ends too (before: it ran on, orphaned, and node 0's
    launcher then waited for the dead one), and node 0 fails."""
    run = nodes([*PREFILL, "--seq-len", "4096", "--repeat", "200"], [*PREFILL, "--seq-len", "4096", "--repeat", "200"])
    deadline = time.monotonic() + BOUND_S
    while " chunks" not in run.err(0):  # node 0's rank reports a finished step: both ranks run
        assert time.monotonic() < deadline and run.procs[0].poll() is None, run.err(0)[-2000:]
        time.sleep(0.2)
    agent = run.procs[1].pid
    ranks = _children(agent)
    assert ranks, "node 1's launcher has no rank"
    os.kill(agent, signal.SIGKILL)
    run.procs[1].wait(timeout=10)
    end = time.monotonic() + 20
    while any(_running(r) for r in ranks) and time.monotonic() < end:
        time.sleep(0.2)
    left = [r for r in ranks if _running(r)]
    assert not left, f"node 1's rank {left} outlived its launcher"
    assert run.procs[0].wait(timeout=BOUND_S) != 0
