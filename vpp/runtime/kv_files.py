"""A request's caches in a directory, written by one job and read by another of any layout.

Layout of ``DIR`` (format ``vpp-kv/1``)::

    DIR/manifest.json              written last, by the writer instance's first rank
    DIR/rank-00000.safetensors     one file per writing rank (global rank in the name)

``manifest.json`` holds ``format``, ``request`` (its id, as given), ``tokens`` (cached tokens, rows
``0 .. tokens - 1`` = positions), ``writer`` (the writing job's layout: ``tp``, ``pp`` and, per
pipeline rank, the layer ranges of its stages), ``extra`` (what the caller adds: the prompt, the
tokens generated so far, a sampler's state; JSON) and ``tensors``: one entry per stored slice with
``file``, ``key`` (its name in that file), ``name`` (as ``Stage.export_cache`` names tensors:
``model.layers.{i}.self_attn.{k|v|latent|index_k}``), ``dim``, ``start``, ``end``, ``full`` (the
slice ``[start, end)`` of ``full`` entries of dim ``dim``; ``dim`` null: the whole tensor), ``shape``
and ``dtype``. Together the slices tile every full tensor once: a replicated tensor (MLA's latent,
DSA's indexer keys, a GQA head that several TP ranks hold) is written by one rank only
(:func:`vpp.plan.kv_handover.plan_transfers` to one destination that needs everything).

A reader plans from the stored slices to the slices its own stages hold and reads only those (a
safetensors slice read), so any TP x PP layout can continue the request.

Whole or absent: the manifest is written last, so a save that fails leaves no readable directory; a
directory that already holds a manifest is refused (its files would be replaced under the old
manifest), as is a path that is a file. A damaged directory (a truncated, missing or foreign file, a
manifest without its slices) is one ``ValueError`` naming the file, before any cache is installed.
"""

from __future__ import annotations

import json
import os
from typing import Any, Hashable

import torch
import torch.distributed as dist

from vpp.plan.kv_handover import Holding, Piece, plan_transfers
from vpp.safe_write import write_bytes, write_text

from .handover import install_caches, local_caches, pieces_of
from .watchdog import rendezvous

FORMAT = "vpp-kv/1"


def _full(p: Piece) -> Piece:
    return p if p.dim is None else Piece(p.name, p.dim, 0, p.full, p.full)


@torch.inference_mode()
def save_cache(pipe, request: Hashable, directory: str, *, extra: dict | None = None) -> dict:
    """Write ``request``'s caches held by this instance to ``directory`` (a collective over the
    instance: every rank of ``pipe.groups`` calls it). Returns the manifest (on every rank)."""
    groups = pipe.groups
    members, me = groups.members, groups.global_rank
    local = local_caches(pipe, request)
    problem = None if local else f"global rank {me}: request {request!r} has no caches here to save"
    mine = (me, pieces_of(pipe.stages), {n: (list(t.shape), str(t.dtype).replace("torch.", "")) for n, t in local.items()},
            [list(st.layer_range) for st in pipe.stages], groups.pp.rank, problem or directory_problem(directory))
    infos: list[Any] = [mine]
    if dist.is_initialized() and len(members) > 1:
        rendezvous("saving the KV caches", me, members, timeout_s=pipe.timeout_s)
        infos = [None] * len(members)
        dist.all_gather_object(infos, mine, group=groups.instance_pg)
    problem = next((info[5] for info in infos if info[5]), None)
    if problem:  # the same on every rank, before anything is written
        raise ValueError(problem)
    everything = {p.name: _full(p) for _, pieces, *_ in infos for p in pieces}
    plan = plan_transfers([Holding(r, pieces) for r, pieces, *_ in infos],
                          [Holding(-1, tuple(everything[n] for n in sorted(everything)))])
    os.makedirs(directory, exist_ok=True)
    shapes = {n: s for _, _, sh, *_ in infos for n, s in sh.items()}
    entries, mine_out = [], {}
    for t in plan:
        key = t.name if t.dim is None else f"{t.name}[{t.start}:{t.end}]"
        shape = list(shapes[t.name][0])
        if t.dim is not None:
            shape[t.dim] = t.length
        entries.append(dict(file=f"rank-{t.src:05d}.safetensors", key=key, name=t.name, dim=t.dim, start=t.start,
                            end=t.end if t.dim is not None else 1, full=everything[t.name].full, shape=shape,
                            dtype=shapes[t.name][1]))
        if t.src == me:
            x = local[t.name] if t.dim is None else local[t.name].narrow(t.dim, t.src_offset, t.length)
            mine_out[key] = x.contiguous().cpu()
    if mine_out:  # beside the target, renamed over a regular file only (vpp.safe_write)
        from safetensors.torch import save
        write_bytes(os.path.join(directory, f"rank-{me:05d}.safetensors"), save(mine_out))
    stages_by_pp: dict[int, list] = {}
    for _, _, _, ranges, pp_rank, _ in infos:
        stages_by_pp.setdefault(pp_rank, ranges)
    manifest = dict(format=FORMAT, request=request if isinstance(request, (int, str)) else repr(request),
                    tokens=pipe.stages[0].cache_length(request),
                    writer=dict(tp=groups.tp.size, pp=groups.pp.size,
                                stages=[stages_by_pp[r] for r in sorted(stages_by_pp)]),
                    extra=extra or {}, tensors=entries)
    if dist.is_initialized() and len(members) > 1:  # every file is complete before the manifest exists
        rendezvous("the KV files written", me, members, timeout_s=pipe.timeout_s)
        dist.barrier(group=groups.instance_pg)
    if me == members[0]:
        write_text(os.path.join(directory, "manifest.json"), json.dumps(manifest))
    return manifest


def directory_problem(directory: str) -> str | None:
    """Why ``directory`` cannot take a save, or None. A directory that already holds a manifest is
    refused (as ``vpp generate --save-kv`` does): its rank files would be replaced one by one before
    the new manifest, so a save failing half-way would leave the old manifest over new files."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        return f"{directory}: not a directory (save_cache writes a directory of files)"
    if os.path.lexists(os.path.join(directory, "manifest.json")):
        return (f"{directory}: already holds saved caches (manifest.json); choose an empty directory, or remove "
                f"the old caches first")
    return None


ENTRY_KEYS = ("file", "key", "name", "dim", "start", "end", "full", "shape", "dtype")


def read_manifest(directory: str) -> dict:
    path = os.path.join(directory, "manifest.json")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable KV directory manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{path}: format {got!r}, expected {FORMAT!r}")
    tokens, entries = manifest.get("tokens"), manifest.get("tensors")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"{path}: tokens={tokens!r} must be a token count >= 1")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: 'tensors' must be a non-empty list of stored slices, got {entries!r:.60}")
    for i, e in enumerate(entries):
        missing = [k for k in ENTRY_KEYS if not isinstance(e, dict) or k not in e]
        if missing:
            raise ValueError(f"{path}: tensors[{i}] lacks {missing}")
        if os.path.basename(str(e["file"])) != e["file"]:
            raise ValueError(f"{path}: tensors[{i}] names file {e['file']!r} outside the directory")
    return manifest


@torch.inference_mode()
def load_cache(pipe, request: Hashable, directory: str, *, reserve: int = 0) -> dict:
    """Install the caches saved in ``directory`` as ``request``'s on this rank's stages, reading only
    the slices they hold (no communication: each rank reads its own). ``reserve``: tokens the request
    will still append. Returns the manifest."""
    from safetensors import safe_open

    held = [(list(st.layer_range), st.cache_length(request)) for st in pipe.stages if st.cache_length(request)]
    if held:  # checked before reading, so that no stage is left with half a request
        raise ValueError(f"request {request!r} already holds {held[0][1]} tokens on stage {held[0][0]}: release it "
                         f"before loading its caches")
    manifest = read_manifest(directory)
    entries = manifest["tensors"]
    sources = [Holding(i, (Piece.whole(e["name"]) if e["dim"] is None else
                           Piece(e["name"], e["dim"], e["start"], e["end"], e["full"]),)) for i, e in enumerate(entries)]
    needs = pieces_of(pipe.stages)
    try:
        plan = plan_transfers(sources, [Holding(0, needs)])
    except ValueError as exc:  # another model's caches, or a partial save
        raise ValueError(f"{directory}: the saved caches (written by a pipeline of {manifest.get('writer')}) do "
                         f"not cover this rank's stages: {exc}") from None
    device = pipe.groups.device
    tensors = {}
    for p in needs:
        shape = list(next(e["shape"] for e in entries if e["name"] == p.name))
        if p.dim is not None:
            shape[p.dim] = p.end - p.start
        dtype = getattr(torch, next(e["dtype"] for e in entries if e["name"] == p.name))
        tensors[p.name] = torch.empty(shape, dtype=dtype, device=device)
    opened: dict[str, Any] = {}
    try:
        for t in plan:
            e = entries[t.src]
            path = os.path.join(directory, e["file"])
            try:
                if e["file"] not in opened:
                    opened[e["file"]] = safe_open(path, framework="pt")
                part = opened[e["file"]].get_slice(e["key"])
                if list(part.get_shape()) != list(e["shape"]):
                    raise ValueError(f"shape {list(part.get_shape())}, the manifest says {list(e['shape'])}")
                if t.dim is None:
                    x = part[:]
                else:
                    index = [slice(None)] * len(e["shape"])
                    index[t.dim] = slice(t.src_offset, t.src_offset + t.length)
                    x = part[tuple(index)]
                dst = tensors[t.name] if t.dim is None else tensors[t.name].narrow(t.dim, t.dst_offset, t.length)
                dst.copy_(x)
            except Exception as exc:  # a truncated, corrupted, missing or foreign file: one line naming it
                raise ValueError(f"{path}: cannot read {e['key']!r} of the saved caches "
                                 f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    finally:
        opened.clear()
    install_caches(pipe, request, tensors, int(manifest["tokens"]) + reserve)
    return manifest


__all__ = ["ENTRY_KEYS", "FORMAT", "directory_problem", "load_cache", "read_manifest", "save_cache"]
