"""Opening a model by name or path: the built-in tiny models, the toy model, or a Hugging Face
model directory. One place that the CLI, the examples and the benchmarks share.

dtype: ``"auto"`` runs a model directory in the dtype its config declares (``torch_dtype``: bf16 for
the DeepSeek, GLM and Qwen releases; FP8 block-quantized weights are dequantized into it) and the
built-in models in float32 on CPU; on an accelerator (CUDA, NPU) "auto" is always 16 bits: the config's
bf16/fp16, else bf16 (the grouped expert GEMMs and flash attention kernels run in 16 bits only). A
torch dtype (or its name) overrides it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from vpp.config import DTYPES, SUPPORTED_MODEL_TYPES, config_dtype, model_config
from vpp.models.model_dir import check_model_dir
from vpp.parallel.grid import GridSizes
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
    dtype: torch.dtype = torch.float32

    def layout(self, kind: str, pp: int, folds: int = 1):
        """A ``kind`` layout ("loop", "v", "interleaved") of this model on ``pp`` ranks, stages as even
        as the model's allowed stage starts permit (GLM-5's shared-indexer layers cannot start one). A run's
        layout for a strategy is chosen by :func:`vpp.models.run_layout.layout_for`."""
        from vpp.schedules import make_layout
        folds = 1 if kind == "loop" else folds
        n_stages = pp * (1 if kind == "loop" else 2 * folds)
        partition = snap_partition(self.num_layers, n_stages, self.stage_starts)
        return make_layout(kind, self.num_layers, pp, folds=folds, partition=partition)

    def stages(self, layout, groups: ParallelGroups) -> list[torch.nn.Module]:
        """This pipeline rank's stage modules for ``layout`` (a :class:`vpp.schedules.Layout`), in stage order."""
        return [self.build(layout.stage_layers[s], groups) for s in layout.stages_of(groups.pp.rank)]

    def check(self, layout, sizes: GridSizes) -> None:
        """Build every stage of ``layout`` as every rank of the grid would, on the meta device (no
        memory, no weights): a model that cannot be split over these sizes (heads over tp, experts
        over ep, ...) raises the same error here as on the ranks, before any rank starts."""
        if self.config.get("model_type") not in SUPPORTED_MODEL_TYPES:
            return  # the toy model has no parallel dimension
        from vpp.models.build import build_stage
        for global_rank in range(sizes.world_size):
            groups = ParallelGroups.virtual(sizes, global_rank)
            if groups.dp.rank:
                continue
            for s in layout.stages_of(groups.pp.rank):
                build_stage(self.config, layout.stage_layers[s], groups, device="meta")


def resolve_dtype(spec: str, dtype: torch.dtype | str = "auto", *, device_kind: str = "cpu") -> torch.dtype:
    """The dtype ``spec`` runs in on a ``device_kind`` device: ``dtype`` itself, or for ``"auto"`` the
    model directory's config dtype (float32 when it declares none, and for the built-in models), made
    16-bit on an accelerator (see the module docstring)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is not one of auto, {', '.join(DTYPES)}")
        return getattr(torch, dtype)
    declared = None
    if spec not in BUILTIN and os.path.isdir(spec):
        declared = config_dtype(model_config(spec), os.path.join(spec, "config.json"))
    if device_kind != "cpu":
        return getattr(torch, declared if declared in ("bfloat16", "float16") else "bfloat16")
    return getattr(torch, declared or "float32")


def check_model(spec: str, *, dtype: torch.dtype | str = "auto") -> None:
    """What a launcher checks in its parent process before starting ranks: a built-in name, or a
    model directory that :func:`vpp.models.check_model_dir` accepts. Raises ValueError (ConfigError,
    CheckpointError) with one line naming the file and key or tensor."""
    if spec in BUILTIN:
        return
    if not os.path.isdir(spec):
        raise ValueError(f"unknown model {spec!r}: give one of {list(BUILTIN)} or a model directory "
                         f"(config.json + safetensors)")
    check_model_dir(spec, dtype=dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch."))


def open_model(spec: str, *, dtype: torch.dtype | str = "auto", seed: int = 0,
               moe_dispatch: str = "allreduce", device_kind: str = "cpu") -> ModelSource:
    """``spec`` is one of :data:`BUILTIN` or a model directory (config.json + safetensors); ``dtype``
    as :func:`resolve_dtype` on a ``device_kind`` device (``ModelSource.dtype`` is the one chosen)."""
    dtype = resolve_dtype(spec, dtype, device_kind=device_kind)
    if spec == "toy":
        from vpp.models.toy import ToyStage
        n = 8
        return ModelSource("toy", n, tuple(range(n)),
                           lambda r, g: ToyStage(r, n, hidden_size=64, vocab_size=512, seed=seed, dtype=dtype,
                                                 device=g.device),
                           {"model_type": "toy", "num_hidden_layers": n}, dtype)
    from vpp.models import build_stage, load_stage, random_checkpoint, stage_starts
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
    return ModelSource(spec, cfg["num_hidden_layers"], tuple(stage_starts(cfg)), build, dict(cfg), dtype)


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


__all__ = ["BUILTIN", "ModelSource", "check_model", "open_model", "resolve_dtype", "snap_partition"]
