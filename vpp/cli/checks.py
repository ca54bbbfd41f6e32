"""Checks the commands run in their own process before starting any rank: the model exists, reads,
and splits over the requested grid (by building every stage on the meta device)."""

from __future__ import annotations

import os

from vpp.cli.args import UsageError


def open_checked(spec: str, *, tp: int, pp: int, schedules, folds: int = 1, ep: int = 1,
                 chunk: int | None = None, seq_len: int | None = None, partition: str = "even",
                 kind: str | None = None):
    """The :class:`~vpp.models.registry.ModelSource` of ``spec`` and each schedule's layout (chosen here,
    once per run, by :func:`vpp.models.run_layout.layout_for`), once every layout is known to build on a
    (tp, pp, ep) grid; a :class:`UsageError` naming the problem otherwise."""
    from vpp.config import ConfigError
    from vpp.models.registry import BUILTIN, open_model
    from vpp.models.run_layout import layout_for
    from vpp.parallel.grid import GridSizes

    if spec not in BUILTIN and not os.path.isdir(spec):
        raise UsageError(f"--model {spec}: neither a built-in model ({', '.join(BUILTIN)}) nor a model directory")
    if os.path.isdir(spec):
        _check_files(spec)
    try:
        if os.path.isdir(spec):  # the config's types and counts against the headers, before anything per layer
            from vpp.models.model_dir import check_model_dir
            check_model_dir(spec, dtype="float32")
        model = open_model(spec)
    except (ConfigError, ValueError, OSError) as exc:
        raise UsageError(f"--model {spec}: {exc}") from None
    sizes = GridSizes(tp * pp, tp=tp, pp=pp, ep=ep)
    layouts = {}
    for schedule in schedules:
        try:
            layouts[schedule] = layout_for(model, schedule, pp, folds, chunk=chunk, seq_len=seq_len, partition=partition,
                                           kind=kind)
            model.check(layouts[schedule], sizes)
        except ValueError as exc:
            raise UsageError(f"{schedule} with --tp {tp} --pp {pp}"
                             + (f" --folds {folds}" if folds > 1 else "") + (f" --layout {kind}" if kind else "")
                             + f" on {spec}: {exc}") from None
    return model, layouts


def _check_files(model_dir: str) -> None:
    has_weights = any(os.path.isfile(os.path.join(model_dir, f))
                      for f in ("model.safetensors", "model.safetensors.index.json"))
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise UsageError(f"--model {model_dir}: no config.json in the directory")
    if not has_weights:
        raise UsageError(f"--model {model_dir}: neither model.safetensors nor model.safetensors.index.json "
                         f"in the directory")


def loaded_identity(args) -> dict:
    """What the ranks must agree on beside their arguments: a model directory's digest (config, headers
    and a sample of every tensor: :func:`vpp.models.safetensors_files.checkpoint_digest`), so that nodes
    whose same ``--model`` path holds other checkpoints are refused on every rank before any work."""
    spec = getattr(args, "model", None)
    if not isinstance(spec, str) or not os.path.isdir(spec):
        return {}
    from vpp.models.safetensors_files import checkpoint_digest
    return {"--model": f"{spec} (checkpoint digest {checkpoint_digest(spec)})"}


def check_devices(device: str, ranks: int) -> None:
    """Spawned ranks need one device each: refuse fewer devices than ranks before spawning any."""
    from vpp.parallel.device import get_accelerator
    from vpp.parallel.spawn import check_device_count, launched_by_torchrun
    if launched_by_torchrun():
        return  # torchrun placed the processes: the local rank picks the card
    try:
        check_device_count(get_accelerator(None if device == "auto" else device), ranks)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(f"--device {device}: {exc}") from None


__all__ = ["check_devices", "loaded_identity", "open_checked"]
