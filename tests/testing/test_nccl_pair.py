"""``python -m vpp.testing.nccl_pair`` (device_check part d), rehearsed on gloo: two ranks, warm-up, a
prefill equal to the unpipelined forward, an idle gap longer than the timeout, and a rank that dies
mid-prefill named by the other within the timeout. Part (a)'s family check skips, with a line, a family
this transformers cannot configure."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_the_pair_job_on_gloo():
    from vpp.testing.nccl_pair import run_pair
    first, second = run_pair("gloo", limit_s=240, cwd=ROOT, timeout_s=2.0)  # the device check's 4 s: a 6 s gap
    assert "error" not in first, first
    assert first["idle_gap"]["timeout_s"] == 2.0
    assert first["max_abs_diff"] < 1e-4 and first["idle_gap"]["requests"] == [1, 2]
    assert first["idle_gap"]["gap_s"] > first["idle_gap"]["timeout_s"]
    fault = first["fault"]
    assert fault["raised"] and fault["named_global_rank"] == 1 and fault["wall_s"] <= fault["within_s"], fault
    assert "fault" not in second  # rank 1 died before it could report one


def test_a_family_this_transformers_lacks_is_skipped_with_a_line(monkeypatch):
    sys.path.insert(0, ROOT)
    try:
        from benchmarks.device_check import FAMILIES, family_missing
        import tests.models.hf_tiny as hf_tiny
    finally:
        sys.path.remove(ROOT)
    assert [family_missing(f) for f in FAMILIES] == [None] * len(FAMILIES)  # the installed transformers has all

    def lacks(family, **kw):
        raise AttributeError("module 'transformers' has no attribute 'GlmMoeDsaConfig'")

    monkeypatch.setattr(hf_tiny, "config", lacks)
    line = family_missing("glm_moe_dsa")
    assert line.startswith("transformers ") and "cannot build the glm_moe_dsa config (AttributeError" in line
