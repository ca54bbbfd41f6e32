"""What ``launch`` / ``run_distributed`` refuse before any process starts (no process here; the
spawned behaviour, a rank that raises or hangs, is tests/parallel/test_harness.py's)."""

from __future__ import annotations

import pytest

from vpp.parallel import launch, run_distributed


def _never(rank, world):  # pragma: no cover - never called: every call below is refused first
    raise AssertionError("a rank ran")


@pytest.mark.parametrize("world, kw, message", [
    (0, {}, r"world_size=0 must be an integer >= 1"),        # ran nothing and returned []
    (-1, {}, r"world_size=-1 must be an integer >= 1"),
    (1.5, {}, r"world_size=1.5 must be an integer >= 1"),    # a TypeError from range()
    (2, dict(timeout=float("nan")), r"timeout=nan must be a finite number of seconds > 0"),  # failed in the ranks
    (2, dict(timeout=float("inf")), r"timeout=inf must be a finite number of seconds > 0"),
    (2, dict(timeout=0), r"timeout=0 must be a finite number of seconds > 0"),
    (2, dict(pg_timeout_s=-1.0), r"pg_timeout_s=-1.0 must be a finite number of seconds > 0"),
])
@pytest.mark.parametrize("call", [launch, run_distributed])
def test_bad_launches_are_refused_before_any_process(call, world, kw, message):
    with pytest.raises(ValueError, match=message):
        call(_never, world, device="cpu", **kw)
