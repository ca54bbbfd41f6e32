"""The one table of prefill strategies: each name once, with its layout, builder and description.

Every command, benchmark and API call that takes a strategy name looks it up here (:func:`get`), so a
name means the same thing everywhere and an unknown name gives the same error everywhere.

* ``cpp``        -- chunked-prefill pipeline parallelism: a loop layout (one stage per rank), fixed
  chunks, blocking transfers, requests pipelined back to back (:func:`.builders.build_cpp`).
* ``dcpp``       -- the same plan with DCPP's chunk sizes (a :class:`.dcpp.DcppPlanner`, profiled on the
  real stage or on a cost model), the baseline of SGLang and vLLM-Ascend; its modes reproduce each
  engine's planner at a named commit (``vllm-ascend``, the paper's baseline and the default;
  ``vllm-ascend-7896``; ``sglang``).
* ``vpp``        -- the paper's Algorithm 1 over a V (2 folds x P stages), blocking.
* ``vpp-async``  -- VPP with one slot of slack per remote hop and non-blocking transfers.
* ``vpp-packed`` -- VPP-Async with cross-request pipelined packing (Algorithm 2).
* ``gpipe``      -- an outside reference: torch.distributed.pipelining's GPipe on the same stages,
  chunks as micro-batches. It has no plan of vpp's (PyTorch's runtime schedules it); its simulated
  counterpart is ``cpp``.

Three variants put those in context in simulations (``variant=True``; offered by no default list):
``cpp-async`` / ``dcpp-async`` (the loop with non-blocking transfers: rank 0 may run unboundedly
ahead; an upper bound for CPP while a transfer takes less than tau grows per chunk, since each receive
is posted after the rank's previous compute and a longer transfer shows on every chunk,
tests/schedules/test_closed_forms.py) and ``vpp-async-pipelined`` (VPP-Async whose unit-time order numbers
the chunks of all requests consecutively).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .builders import build_cpp, build_vpp, build_vpp_async
from .ir import Plan, Request
from .layout import Layout
from .packing import build_vpp_packed

Builder = Callable[..., Plan]


@dataclass(frozen=True)
class Strategy:
    """``layout``: the layout kind the strategy runs on ("loop" or "v"); ``chunking``: "fixed" or "dcpp"
    (chunk sizes from a DCPP planner); ``builder(layout, requests, *, concurrency, cost)`` emits the
    plan (None for ``gpipe``, which PyTorch schedules); ``variant``: a simulation-only context row;
    ``packs``: the plan packs requests into each other's drains."""

    name: str
    label: str
    layout: str
    description: str
    builder: Builder | None
    chunking: str = "fixed"
    variant: bool = False
    packs: bool = False  # packs the next request's first chunks into a drain (Algorithm 2)

    def plan(self, layout: Layout, requests: Sequence[Request], *, concurrency: int | None = None,
             cost=None, steps=None, any_layout: bool = False) -> Plan:
        """The plan of this strategy for ``requests`` on ``layout`` (``cost`` only steers packing);
        ``steps``: steps shared by requests (:mod:`.steps`), None for one request per step;
        ``any_layout``: build on whatever layout is given (a simulation's what-if), else a V strategy
        refuses a loop of several ranks (stage modules that cannot run it)."""
        if self.builder is None:
            raise ValueError(f"{self.name} has no plan of vpp's: {self.description}")
        if not any_layout and self.layout == "v" and layout.kind == "loop" and layout.num_ranks > 1:
            raise ValueError(f"{self.name} needs 2f stages per rank (a V); the stage modules form "
                             f"{layout.describe()}")
        if steps is not None:
            return self.builder(layout, requests, concurrency=concurrency, cost=cost, steps=steps)
        return self.builder(layout, requests, concurrency=concurrency, cost=cost)


def _cpp(comm: str, name: str) -> Builder:
    def build(layout, requests, *, concurrency=None, cost=None, steps=None):
        return build_cpp(layout, requests, comm=comm, name=name, concurrency=concurrency, steps=steps)
    return build


def _vpp(layout, requests, *, concurrency=None, cost=None, steps=None):
    return build_vpp(layout, requests, concurrency=concurrency, steps=steps)


def _vpp_async(order: str, name: str) -> Builder:
    def build(layout, requests, *, concurrency=None, cost=None, steps=None):
        return build_vpp_async(layout, requests, concurrency=concurrency, request_order=order, name=name,
                               steps=steps)
    return build


def _vpp_packed(layout, requests, *, concurrency=None, cost=None, steps=None):
    if steps is not None:  # shared steps flow back to back: no drain between requests is left to pack
        return build_vpp_async(layout, requests, concurrency=concurrency, name="vpp-packed", steps=steps)
    return build_vpp_packed(layout, requests, cost=cost, concurrency=concurrency)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("cpp", "CPP", "loop", "fixed chunks through one stage per rank, blocking transfers",
             _cpp("blocking", "cpp")),
    Strategy("dcpp", "DCPP", "loop", "CPP with chunks shrunk to equal time (SGLang / vLLM-Ascend)",
             _cpp("blocking", "dcpp"), chunking="dcpp"),
    Strategy("vpp", "VPP", "v", "fold-back V layout, Algorithm 1, blocking transfers", _vpp),
    Strategy("vpp-async", "VPP-Async", "v", "VPP reordered so transfers overlap compute, non-blocking",
             _vpp_async("sequential", "vpp-async")),
    Strategy("vpp-packed", "VPP-Async + packing", "v",
             "VPP-Async with the next request's first chunks packed into the drain (Algorithm 2)", _vpp_packed,
             packs=True),
    Strategy("gpipe", "GPipe (torch)", "loop",
             "torch.distributed.pipelining's ScheduleGPipe on the same stages, chunks as micro-batches", None),
    Strategy("cpp-async", "(CPP, non-blocking)", "loop", "CPP with non-blocking transfers (unbounded run-ahead)",
             _cpp("async", "cpp-async"), variant=True),
    Strategy("dcpp-async", "(DCPP, non-blocking)", "loop", "DCPP with non-blocking transfers",
             _cpp("async", "dcpp-async"), chunking="dcpp", variant=True),
    Strategy("vpp-async-pipelined", "(VPP-Async, pipelined order)", "v",
             "VPP-Async whose slot order runs all requests' chunks consecutively",
             _vpp_async("pipelined", "vpp-async-pipelined"), variant=True),
)}

# what the commands offer by default
PLANNED = tuple(n for n, s in STRATEGIES.items() if s.builder is not None and not s.variant)  # the ones with a builder
PIPELINE = tuple(n for n in PLANNED if STRATEGIES[n].chunking == "fixed")  # runnable from fixed chunks alone
CONTENDERS = tuple(n for n, s in STRATEGIES.items() if not s.variant)  # real-rank stream comparison


def get(name: str, among: Sequence[str] | None = None) -> Strategy:
    """The strategy called ``name`` (restricted to ``among`` when given); a ValueError naming the
    choices otherwise."""
    choices = tuple(among) if among is not None else tuple(STRATEGIES)
    if name not in choices:
        raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(choices)}")
    return STRATEGIES[name]


def parse(text: str | Sequence[str], among: Sequence[str] | None = None) -> tuple[str, ...]:
    """Comma-separated (or a list of) strategy names, each checked with :func:`get`."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else [str(n).strip() for n in text]
    names = [n for n in names if n]
    if not names:
        raise ValueError("no strategy given")
    for n in names:
        get(n, among)
    return tuple(names)


__all__ = ["Builder", "CONTENDERS", "PIPELINE", "PLANNED", "STRATEGIES", "Strategy", "get", "parse"]
