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
slice ``[start, end)`` of ``full`` entries of dim ``dim``; ``dim`` null: the whole tensor), ``shape``,
``dtype`` and ``crc32`` (of the slice's bytes); ``save_id`` (random) is also in every rank file's
metadata (``vpp-kv-save``). Together the slices tile every full tensor once: a replicated tensor
(MLA's latent, DSA's indexer keys, a GQA head that several TP ranks hold) is written by one rank only
(:func:`vpp.kv.transfer_plan.plan_transfers` to one destination that needs everything).

A reader plans from the stored slices to the slices its own stages hold and reads only the stored
slices those come from (each whole once, to verify its checksum), so any TP x PP layout can continue
the request.

Context parallelism (format ``vpp-kv/2``, written by a pipeline whose stages are CP groups): each
CP rank writes the rows of its own tokens (its shard, never a gathered sequence). The manifest adds
``shards`` (per writer CP rank, the tokens of its rows in row order, as runs ``[[start, end], ...]``:
:func:`vpp.kv.token_rows.to_runs`) and ``writer.cp``; each stored slice names its ``shard``, and its
token dim holds that shard's rows. A reader of any layout (TP, PP, CP) takes from each stored shard
only the rows of the tokens it holds (:func:`vpp.kv.token_rows.reader_shards`: the same shards where
the CP sizes agree, every token in order without CP, else a head-tail split), so each of its ranks
gets exactly its layers, heads and tokens. A ``vpp-kv/1`` directory is one shard of every token.

Whole or absent: the manifest is written last, so a save that fails leaves no readable directory; a
directory that already holds a manifest is refused (its files would be replaced under the old
manifest), as is a path that is a file. A damaged directory (a truncated, missing, corrupted or
foreign file, a file of another save, a manifest without its slices) or another model's caches (layer
count, cache tensors, widths, heads, dtype: :func:`model_problem`) is one ``ValueError`` naming the
file, before any cache is installed. Directories written before ``save_id`` and ``crc32`` existed
load without those two checks.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any, Hashable

import torch
import torch.distributed as dist

from vpp.kv.token_rows import coverage_problem, from_runs, reader_shards, rows_between, to_runs
from vpp.kv.transfer_plan import Holding, Piece, plan_transfers
from vpp.transformer.attention.cache import shape_problem
from vpp.safe_write import write_bytes, write_text

from .handover import cache_shapes_of, install_caches, local_caches, pieces_of
from vpp.runtime.watchdog import rendezvous

FORMAT = "vpp-kv/1"
FORMAT_CP = "vpp-kv/2"  # the caches of a context-parallel writer: one shard of rows per CP rank
SAVE_ID_KEY = "vpp-kv-save"  # a rank file's metadata: the save it belongs to (the manifest's save_id)


def crc32(x: torch.Tensor) -> int:
    """CRC-32 of ``x``'s bytes (contiguous, on the CPU): a stored slice's checksum in the manifest."""
    return zlib.crc32(x.contiguous().cpu().reshape(-1).view(torch.uint8).numpy())


def _full(p: Piece) -> Piece:
    return p if p.dim is None else Piece(p.name, p.dim, 0, p.full, p.full)


@torch.inference_mode()
def save_cache(pipe, request: Hashable, directory: str, *, extra: dict | None = None) -> dict:
    """Write ``request``'s caches held by this instance to ``directory`` (a collective over the
    instance: every rank of ``pipe.groups`` calls it). Returns the manifest (on every rank)."""
    groups = pipe.groups
    members, me = groups.members, groups.global_rank
    cp = groups.cp.size
    local = local_caches(pipe, request)
    problem = None if local else f"global rank {me}: request {request!r} has no caches here to save"
    runs = to_runs(pipe.stages[0].cache_positions(request)) if cp > 1 and local else None
    mine = (me, pieces_of(pipe.stages), {n: (list(t.shape), str(t.dtype).replace("torch.", "")) for n, t in local.items()},
            [list(st.layer_range) for st in pipe.stages], groups.pp.rank, problem or directory_problem(directory),
            os.urandom(8).hex(), (request, pipe.stages[0].cache_length(request)), groups.cp.rank, runs)
    infos: list[Any] = [mine]
    if dist.is_initialized() and len(members) > 1:
        rendezvous("saving the KV caches", me, members, timeout_s=pipe.timeout_s)
        infos = [None] * len(members)
        dist.all_gather_object(infos, mine, group=groups.instance_pg)
    problem = next((info[5] for info in infos if info[5]), None)
    theirs = next((info for info in infos if info[7] != infos[0][7]), None)
    if problem is None and theirs is not None:  # each rank would write another request's caches
        problem = (f"the ranks disagree on the request to save (request, cached tokens): global rank {infos[0][0]} "
                   f"gives {infos[0][7]}, global rank {theirs[0]} {theirs[7]}")
    shards = [next(info[9] for info in infos if info[8] == c) for c in range(cp)] if cp > 1 else None
    if problem is None and shards is not None:
        problem = coverage_problem(shards, infos[0][7][1])
        problem = problem and f"request {request!r}'s {cp} CP ranks do not hold each token once: {problem}"
    if problem:  # the same on every rank, before anything is written
        raise ValueError(problem)
    everything = {p.name: _full(p) for _, pieces, *_ in infos for p in pieces}
    entries, mine_out = [], {}
    for c in range(cp):  # one plan per CP rank's shard (each written by one of its ranks)
        ranks = [info for info in infos if info[8] == c]  # (global rank, pieces, shapes, ...) of CP rank c
        plan = plan_transfers([Holding(info[0], info[1]) for info in ranks],
                              [Holding(-1, tuple(everything[n] for n in sorted(everything)))])
        shapes = {n: shape for info in ranks for n, shape in info[2].items()}
        for t in plan:
            _write_entry(t, shapes, everything, c if cp > 1 else None, local if t.src == me else None, entries,
                         mine_out)
    os.makedirs(directory, exist_ok=True)
    save_id = infos[0][6]  # in every file and the manifest: a file of another save is refused
    crcs = {(f"rank-{me:05d}.safetensors", k): crc32(x) for k, x in mine_out.items()}
    if mine_out:  # beside the target, renamed over a regular file only (vpp.safe_write)
        from safetensors.torch import save
        write_bytes(os.path.join(directory, f"rank-{me:05d}.safetensors"),
                    save(mine_out, metadata={SAVE_ID_KEY: save_id}))
    stages_by_pp: dict[int, list] = {}
    for _, _, _, ranges, pp_rank, *_ in infos:
        stages_by_pp.setdefault(pp_rank, ranges)
    manifest = dict(format=FORMAT if cp == 1 else FORMAT_CP,
                    request=request if isinstance(request, (int, str)) else repr(request),
                    tokens=pipe.stages[0].cache_length(request),
                    writer=dict(tp=groups.tp.size, pp=groups.pp.size,
                                stages=[stages_by_pp[r] for r in sorted(stages_by_pp)]),
                    extra=extra or {}, tensors=entries, save_id=save_id,
                    model=None if pipe.model is None else dict(digest=pipe.model[0], name=pipe.model[1]))
    if cp > 1:
        manifest["writer"]["cp"], manifest["shards"] = cp, shards
    if dist.is_initialized() and len(members) > 1:  # every file is complete before the manifest exists
        rendezvous("the KV files written", me, members, timeout_s=pipe.timeout_s)
        every = [None] * len(members)
        dist.all_gather_object(every, crcs, group=groups.instance_pg)
        for theirs in every:
            crcs.update(theirs)
    for e in entries:
        e["crc32"] = crcs[(e["file"], e["key"])]
    if me == members[0]:
        write_text(os.path.join(directory, "manifest.json"), json.dumps(manifest))
    return manifest


def _write_entry(t, shapes: dict, everything: dict, shard: int | None, local: dict | None, entries: list,
                 out: dict) -> None:
    """The manifest entry of stored slice ``t`` (of CP shard ``shard``); its tensor into ``out`` when
    this rank writes it (``local``: this rank's caches)."""
    key = t.name if t.dim is None else f"{t.name}[{t.start}:{t.end}]"
    shape = list(shapes[t.name][0])
    if t.dim is not None:
        shape[t.dim] = t.length
    entry = dict(file=f"rank-{t.src:05d}.safetensors", key=key, name=t.name, dim=t.dim, start=t.start,
                 end=t.end if t.dim is not None else 1, full=everything[t.name].full, shape=shape,
                 dtype=shapes[t.name][1])
    if shard is not None:
        entry["shard"] = shard
    entries.append(entry)
    if local is not None:
        x = local[t.name] if t.dim is None else local[t.name].narrow(t.dim, t.src_offset, t.length)
        out[key] = x.contiguous().cpu()


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


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def read_manifest(directory: str) -> dict:
    path = os.path.join(directory, "manifest.json")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable KV directory manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in (FORMAT, FORMAT_CP):
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{path}: format {got!r}, expected {FORMAT!r} or {FORMAT_CP!r}")
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
        if not (all(_count(e[k]) for k in ("start", "end", "full")) and (e["dim"] is None or _count(e["dim"]))
                and isinstance(e["shape"], list) and all(_count(n) for n in e["shape"])
                and isinstance(e["dtype"], str) and _count(e.get("crc32", 0))):
            raise ValueError(f"{path}: tensors[{i}] holds a malformed field: " +
                             ", ".join(f"{k}={e[k]!r:.40}" for k in ("dim", "start", "end", "full", "shape", "dtype")))
        whole = e["dim"] is None and (e["start"], e["end"], e["full"]) != (0, 1, 1)
        if not e["start"] < e["end"] <= e["full"] or whole:
            raise ValueError(f"{path}: tensors[{i}] ({e['name']}) holds slice [{e['start']}, {e['end']}) of "
                             f"{e['full']} along dim {e['dim']}: empty or out of range")
    shards = manifest.get("shards") if manifest["format"] == FORMAT_CP else [[[0, tokens]]]
    runs_ok = isinstance(shards, list) and shards and all(
        isinstance(r, list) and all(isinstance(x, list) and len(x) == 2 and _count(x[0]) and _count(x[1])
                                    and x[0] < x[1] for x in r) for r in shards)
    if not runs_ok:
        raise ValueError(f"{path}: 'shards' must list, per CP rank, runs [[start, end], ...] of its tokens, got "
                         f"{shards!r:.60}")
    problem = coverage_problem(shards, tokens)
    if problem:
        raise ValueError(f"{path}: the stored shards do not hold each token once: {problem}")
    for i, e in enumerate(entries):
        shard = e.get("shard", 0)
        if not _count(shard) or shard >= len(shards) or (manifest["format"] == FORMAT_CP and "shard" not in e):
            raise ValueError(f"{path}: tensors[{i}] ({e['name']}) names shard {e.get('shard')!r}, the manifest "
                             f"holds {len(shards)} shards")
    return manifest


def shards_of(manifest: dict) -> list[torch.Tensor]:
    """The tokens of each stored shard's rows (one shard of every token in a ``vpp-kv/1`` directory)."""
    if manifest["format"] == FORMAT_CP:
        return [from_runs(r) for r in manifest["shards"]]
    return [torch.arange(int(manifest["tokens"]))]


@torch.inference_mode()
def load_cache(pipe, request: Hashable, directory: str, *, reserve: int = 0) -> dict:
    """Install the caches saved in ``directory`` as ``request``'s on this rank's stages, reading only
    the slices they hold (no communication: each rank reads its own). ``reserve``: tokens the request
    will still append. Returns the manifest."""
    held = [(list(st.layer_range), st.cache_length(request)) for st in pipe.stages if st.cache_length(request)]
    if held:  # checked before reading, so that no stage is left with half a request
        raise ValueError(f"request {request!r} already holds {held[0][1]} tokens on stage {held[0][0]}: release it "
                         f"before loading its caches")
    manifest = read_manifest(directory)
    entries, tokens, g = manifest["tensors"], int(manifest["tokens"]), pipe.groups.cp
    shard_rows = [sum(b - a for a, b in runs) for runs in
                  (manifest["shards"] if manifest["format"] == FORMAT_CP else [[[0, tokens]]])]
    needs = pieces_of(pipe.stages)
    plans = []
    for c in range(len(shard_rows)):  # one plan per stored shard: every shard holds rows of every tensor
        sources = [Holding(i, (Piece.whole(e["name"]) if e["dim"] is None else
                               Piece(e["name"], e["dim"], e["start"], e["end"], e["full"]),))
                   for i, e in enumerate(entries) if e.get("shard", 0) == c]
        try:
            plans.append(plan_transfers(sources, [Holding(0, needs)]))
        except ValueError as exc:  # another model's caches, or a partial save
            raise ValueError(f"{directory}: the saved caches (written by a pipeline of {manifest.get('writer')}) do "
                             f"not cover this rank's stages: {exc}") from None
    problem = (model_problem(entries, tokens, pipe.layout.num_layers, pipe.stages, shard_rows)
               or identity_problem(manifest.get("model"), pipe.model)
               or size_problem(directory, entries, tokens, pipe.stages, [t for p in plans for t in p]))
    if problem:  # another model's caches would install, then decode garbage or fail in the attention
        raise ValueError(f"{os.path.join(directory, 'manifest.json')}: {problem}")
    stored = shards_of(manifest)  # positions: after the size check, so within the model's positions
    readers = reader_shards(stored, tokens, g.size)
    token_dim = {n: list(shape).index(None) for n, (shape, _) in cache_shapes_of(pipe.stages).items()}
    mine = readers[g.rank]
    tensors = {}
    for p in needs:
        shape = list(next(e["shape"] for e in entries if e["name"] == p.name))
        if p.dim is not None:
            shape[p.dim] = p.end - p.start
        shape[token_dim[p.name]] = len(mine)
        dtype = getattr(torch, next(e["dtype"] for e in entries if e["name"] == p.name))
        tensors[p.name] = torch.empty(shape, dtype=dtype, device=pipe.groups.device)
    for c, plan in enumerate(plans):
        rows = rows_between(stored[c], mine, tokens)
        if len(rows[0]):
            _read(directory, manifest, plan, rows, token_dim, tensors)
    install_caches(pipe, request, tensors, tokens + reserve, readers if g.size > 1 else None)
    return manifest


def _read(directory: str, manifest: dict, plan, rows, token_dim: dict, tensors: dict) -> None:
    """Read the stored slices of ``plan`` (one shard's), each whole once to check its checksum, and
    put their rows ``rows[0]`` at ``tensors``' rows ``rows[1]`` (a truncated, corrupted, missing or
    foreign file: one ValueError naming it)."""
    from safetensors import safe_open

    entries = manifest["tensors"]
    opened: dict[str, Any] = {}
    checked: set[int] = set()  # entries whose checksum was verified
    try:
        for t in plan:
            e = entries[t.src]
            path = os.path.join(directory, e["file"])
            try:
                if e["file"] not in opened:
                    opened[e["file"]] = safe_open(path, framework="pt")
                    theirs = (opened[e["file"]].metadata() or {}).get(SAVE_ID_KEY)
                    if "save_id" in manifest and theirs != manifest["save_id"]:
                        raise ValueError(f"the file belongs to save {theirs!r}, the manifest to "
                                         f"{manifest['save_id']!r}")
                part = opened[e["file"]].get_slice(e["key"])
                if list(part.get_shape()) != list(e["shape"]):
                    raise ValueError(f"shape {list(part.get_shape())}, the manifest says {list(e['shape'])}")
                if "crc32" in e and t.src not in checked:  # the whole slice, once: a partial read is checked too
                    whole = part[:]
                    if crc32(whole) != e["crc32"]:
                        raise ValueError(f"checksum {crc32(whole):#010x}, the manifest says {e['crc32']:#010x}: the "
                                         f"file is corrupted")
                    checked.add(t.src)
                    x = whole if t.dim is None else whole.narrow(t.dim, t.src_offset, t.length)
                elif t.dim is None:
                    x = part[:]
                else:
                    index = [slice(None)] * len(e["shape"])
                    index[t.dim] = slice(t.src_offset, t.src_offset + t.length)
                    x = part[tuple(index)]
                dst = tensors[t.name] if t.dim is None else tensors[t.name].narrow(t.dim, t.dst_offset, t.length)
                dim = token_dim[t.name]
                if len(rows[0]) == x.shape[dim] == dst.shape[dim] and torch.equal(rows[0], rows[1]):
                    dst.copy_(x)  # every row, in order (no CP on either side)
                else:
                    dst.index_copy_(dim, rows[1].to(dst.device), x.index_select(dim, rows[0]).to(dst.device))
            except Exception as exc:  # a truncated, corrupted, missing or foreign file: one line naming it
                raise ValueError(f"{path}: cannot read {e['key']!r} of the saved caches "
                                 f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    finally:
        opened.clear()


def identity_problem(saved, running) -> str | None:
    """The saved caches' model (the manifest's ``model``: digest and name) against the pipeline's
    (``Pipeline.model``): another checkpoint of the same shapes (a base model and its fine-tune) is
    refused, naming both. None where either side cannot tell (a save from before the digest existed)."""
    if not isinstance(saved, dict) or running is None or saved.get("digest") in (None, running[0]):
        return None
    return (f"the caches were saved under model {saved.get('name')} (digest {saved.get('digest')}), this pipeline "
            f"runs {running[1]} (digest {running[0]}): another model's caches would decode other tokens")


def size_problem(directory: str, entries: list, tokens: int, stages, plan) -> str | None:
    """Before anything is allocated: ``tokens`` within the model's positions, and every stored slice the
    plan reads holds, in its file's header, the shape the manifest gives it (a manifest cannot make a
    reader allocate more than the files hold)."""
    from safetensors import safe_open
    limit = next((st.max_positions for st in stages if getattr(st, "max_positions", None)), None)
    if limit is not None and tokens > int(limit):
        return f"tokens={tokens} is more than the model's {limit} positions"
    for i in sorted({t.src for t in plan}):
        e = entries[i]
        path = os.path.join(directory, e["file"])
        try:
            with safe_open(path, framework="pt") as f:
                shape = list(f.get_slice(e["key"]).get_shape())
        except Exception:  # noqa: BLE001 -- a missing, truncated or foreign file: the read names it
            continue
        if shape != list(e["shape"]):
            return f"{path}: {e['key']!r} has shape {shape} in the file, the manifest says {list(e['shape'])}"
    return None


def model_problem(entries: list, tokens: int, num_layers: int, stages,
                  shard_rows: list[int] | None = None) -> str | None:
    """Why the stored slices ``entries`` (of ``tokens`` tokens) are not the caches of the model whose
    ``num_layers``-layer pipeline holds ``stages`` on this rank, or None: the layer count, the cache
    tensors of this rank's layers, their widths, heads and dtype (as :meth:`Stage.cache_shapes`), and
    the rows of each (``shard_rows``: of each stored CP shard; else ``tokens``)."""
    try:
        layers = {e["name"]: int(str(e["name"]).split(".")[2]) for e in entries}
    except (IndexError, ValueError):
        return f"a stored tensor's name is not a layer's cache: {next(e['name'] for e in entries)!r}"
    if max(layers.values()) + 1 != num_layers:
        return (f"the saved caches are of a {max(layers.values()) + 1}-layer model, this pipeline's model has "
                f"{num_layers} layers")
    expects = cache_shapes_of(stages)
    ranges = [st.layer_range for st in stages]
    mine = {n for n, i in layers.items() if any(a <= i < b for a, b in ranges)}
    if mine != set(expects):
        return (f"the saved caches hold {sorted(mine - set(expects))[:2]} and lack {sorted(set(expects) - mine)[:2]} "
                f"for the layers of this rank's stages {[list(r) for r in ranges]}")
    for i, e in enumerate(entries):
        if e["name"] not in expects:
            continue
        shape, dtype = expects[e["name"]]
        try:
            problem = shape_problem(e["name"], e["shape"], e["dtype"], shape, dtype, sliced_dim=e["dim"])
            rows = int(e["shape"][shape.index(None)])
        except (TypeError, ValueError, IndexError):
            return f"tensors[{i}] has a malformed shape {e['shape']!r:.60}"
        if problem:
            return problem
        expected = tokens if shard_rows is None else shard_rows[e.get("shard", 0)]
        if rows != expected:
            if shard_rows is None or len(shard_rows) == 1:
                return f"{e['name']} holds {rows} tokens, the manifest says tokens={tokens}"
            return f"{e['name']} holds {rows} rows in shard {e.get('shard', 0)}, the manifest's shards say {expected}"
    return None


__all__ = ["ENTRY_KEYS", "FORMAT", "FORMAT_CP", "SAVE_ID_KEY", "crc32", "directory_problem", "identity_problem",
           "load_cache", "model_problem", "read_manifest", "save_cache", "shards_of", "size_problem"]
