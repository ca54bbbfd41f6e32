"""How long a command's planned prefill work should take, from the paper-scale cost model
(:func:`vpp.perf.cp.full_prefill` on the device's datasheet preset), so that the default ``--timeout``
grows with the work instead of failing a long prompt that is still computing, and an explicit one
that looks too short is warned about before any rank starts."""

from __future__ import annotations

import sys

BASE_TIMEOUT_S = 1800.0  # the floor: what every short run had before the default grew with the work
# The cpu preset's estimate of one whole-model prefill against what the 2-core machine measured, loaded
# (issue 35: 32K tokens of tiny-deepseek, CPP + VPP + VPP-Async, --repeat 1: 24 minutes, 3.5x the
# estimate of 3 x 138 s). 8x leaves twice that, and a spawned run is given twice --timeout in all.
SLACK = 8.0
_PRESETS = {"cpu": "cpu", "cuda": "h100", "npu": "910c"}


def planned_seconds(config: dict, *, tokens: int, tp: int, runs: int, device: str = "cpu") -> float | None:
    """The cost model's seconds for ``runs`` prefills of ``tokens`` tokens, the whole model on one
    device of ``device``'s preset (a pipeline spreads it over its ranks); None for a model the cost
    model does not describe (the toy model)."""
    from vpp.perf.arch import Arch
    from vpp.perf.cp import full_prefill
    from vpp.perf.hardware import get_device
    from vpp.perf.ops import Parallel
    try:
        arch = Arch.from_config(config)
    except (KeyError, TypeError, ValueError):
        return None
    preset = get_device(_PRESETS.get(device, "cpu"))
    return runs * full_prefill(arch, preset, Parallel(tp=tp), 1, tokens)


def timeout_for(given: float | None, config: dict, *, tokens: int, tp: int, runs: int, device: str,
                command: str) -> float:
    """``given`` (an explicit ``--timeout``), warning on stderr when it is shorter than the planned
    work's estimate; or the default: :data:`BASE_TIMEOUT_S`, or :data:`SLACK` x the estimate when
    that is longer."""
    estimate = planned_seconds(config, tokens=tokens, tp=tp, runs=runs, device=device)
    if given is None:
        return BASE_TIMEOUT_S if estimate is None else max(BASE_TIMEOUT_S, round(SLACK * estimate))
    if estimate is not None and given < estimate:
        print(f"vpp {command}: warning: --timeout {given:g} s may expire before the work is done: the cost model "
              f"estimates {estimate:.0f} s for {runs} prefill runs of {tokens} tokens on one {device} device "
              f"(default without --timeout: {max(BASE_TIMEOUT_S, round(SLACK * estimate)):.0f} s)",
              file=sys.stderr)
    return given


__all__ = ["BASE_TIMEOUT_S", "SLACK", "planned_seconds", "timeout_for"]
