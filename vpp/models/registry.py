"""Opening a model by name or path: the built-in tiny models, the toy model, or a Hugging Face
model directory. One place that the CLI, the examples and the benchmarks share."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from vpp.parallel.groups import ParallelGroups

BUILTIN = ("tiny-deepseek", "tiny-qwen", "tiny-glm", "toy")


@dataclass(frozen=True)
class ModelSource:
    """How to build any stage of one model. ``stage_starts``: layers at which a stage may begin."""

    name: str
    num_layers: int
    stage_starts: tuple[int, ...]
    build: Callable[[tuple[int, int], ParallelGroups], torch.nn.Module]
    config: dict

    def stages(self, layout, groups: ParallelGroups) -> list[torch.nn.Module]:
        """This pipeline rank's stage modules for ``layout`` (a :class:`vpp.schedules.Layout`), in stage order."""
        return [self.build(layout.stage_layers[s], groups) for s in layout.stages_of(groups.pp.rank)]


def open_model(spec: str, *, dtype: torch.dtype = torch.float32, seed: int = 0,
               moe_dispatch: str = "allreduce") -> ModelSource:
    """``spec`` is one of :data:`BUILTIN` or a model directory (config.json + safetensors)."""
    if spec == "toy":
        from vpp.models.toy import ToyStage
        n = 8
        return ModelSource("toy", n, tuple(range(n)),
                           lambda r, g: ToyStage(r, n, hidden_size=64, vocab_size=512, seed=seed, dtype=dtype,
                                                 device=g.device),
                           {"model_type": "toy", "num_hidden_layers": n})
    from vpp.models import build_stage, load_stage, model_config, random_checkpoint, stage_starts
    if spec in BUILTIN:
        from vpp.models.tiny import TINY_CONFIGS
        cfg = model_config(TINY_CONFIGS[spec])
        weights = random_checkpoint(cfg, seed)

        def build(r, g):
            return build_stage(cfg, r, g, dtype=dtype, moe_dispatch=moe_dispatch, weights=weights)
    elif os.path.isdir(spec):
        cfg = model_config(spec)

        def build(r, g):
            return load_stage(spec, r, g, dtype=dtype, moe_dispatch=moe_dispatch)
    else:
        raise ValueError(f"unknown model {spec!r}: give one of {list(BUILTIN)} or a model directory "
                         f"(config.json + safetensors)")
    return ModelSource(spec, cfg["num_hidden_layers"], tuple(stage_starts(cfg)), build, dict(cfg))


def snap_partition(num_layers: int, num_stages: int, starts: tuple[int, ...]) -> list[int]:
    """Layers per stage, as even as the allowed stage starts permit (a DSA model whose layers share
    an indexer cannot be cut between them)."""
    allowed = sorted(set(starts) - {0})
    if len(allowed) + 1 < num_stages:
        raise ValueError(f"{num_layers} layers allow only {len(allowed) + 1} stages (starts {[0] + allowed}), "
                         f"{num_stages} asked for")
    bounds, prev = [0], 0
    for s in range(1, num_stages):
        ideal = s * num_layers / num_stages
        remaining = num_stages - s  # stages still to start after this one, including it
        candidates = [a for a in allowed if a > prev and len([b for b in allowed if b > a]) >= remaining - 1]
        choice = min(candidates, key=lambda a: (abs(a - ideal), a))
        bounds.append(choice)
        prev = choice
    bounds.append(num_layers)
    return [b - a for a, b in zip(bounds, bounds[1:])]
