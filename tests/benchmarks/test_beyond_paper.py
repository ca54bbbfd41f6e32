"""beyond_paper.md's prose and labels say what its tables hold (pure: reads the committed files).

The Findings once came from a literal notes file and quoted a fit two versions old (DSA's worst residual
3.4% against the table's 2.1%, VPP-Async over DCPP at 64K 7.3% against 5.2%, ...); and the "longest
prompt" table called DeepSeek's and GLM's 8-bit cache "BF16" (per-token bytes taken at the model's
KV_BYTES = 1, then doubled for "8-bit"). Here the prose must be what the script's finding writers
(:func:`benchmarks.beyond_paper.findings`) give on the committed JSON, and the KV figures must equal the
closed form from the configs."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from benchmarks.beyond_paper import findings
from vpp.perf.runs import KV_BYTES
from vpp.perf.configs import get_config

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _md() -> str:
    return (RESULTS / "beyond_paper.md").read_text()


def test_the_committed_findings_are_written_from_the_committed_numbers():
    md, blob = _md(), json.loads((RESULTS / "beyond_paper.json").read_text())
    committed = md.split("## Findings", 1)[1].rsplit("_Generated in", 1)[0].strip()
    handover = re.search(r"hand-over across the nodes takes ([0-9.]+) ms", committed)
    now = findings(blob, handover_s=float(handover.group(1)) / 1e3)
    assert now.split("## Findings", 1)[1].strip() == committed


def _fit_row(model: str) -> list[str]:
    for line in _md().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == model and cells[1].endswith("KiB"):
            return cells
    raise AssertionError(f"no KV-per-token row for {model} in beyond_paper.md")


def _v_rank_layers(layers: int, pp: int = 2) -> int:
    """Layers on the busiest rank of a one-fold V with an even split (rank r holds stages r and 2pp-1-r)."""
    sizes = [layers // (2 * pp) + (1 if s < layers % (2 * pp) else 0) for s in range(2 * pp)]
    return max(sizes[r] + sizes[2 * pp - 1 - r] for r in range(pp))


@pytest.mark.parametrize("model", ["deepseek-v3.1", "glm-5.2"])
def test_the_longest_prompt_table_is_in_bf16_and_8_bit(model):
    cfg = get_config(model)
    values = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] + (cfg.get("index_head_dim") or 0)  # MLA latent (+ DSA keys)
    per_token_bf16 = 2 * values * _v_rank_layers(cfg["num_hidden_layers"])
    cells = _fit_row(model)
    assert cells[1] == f"{per_token_bf16 / 1024:.0f} KiB"
    bf16, int8 = (int(c.rstrip("K")) for c in cells[2:4])
    row = next(line for line in _md().splitlines() if line.startswith(f"| {model} | 128K | vpp-async |"))
    weights, activations = (float(c) for c in row.strip("|").split("|")[3:6:2])
    free = 64e9 - (weights + activations) * 1e9                       # the table's GB, rounded to 10 MB
    assert abs(bf16 - free / per_token_bf16 / 1024) <= 1.5
    assert abs(int8 - 2 * free / per_token_bf16 / 1024) <= 1.5
    assert KV_BYTES[model] == 1 and "deepseek-v3.1: 8-bit, glm-5.2: 8-bit" in _md()
