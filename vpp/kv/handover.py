"""Handing prefilled requests from the prefill instance to the decode instance of another layout.

After a prefill on PP_p x TP_p ranks, :func:`hand_over` moves requests' caches to the ranks of a
decode instance (PP_d x TP_d; any layer split, any TP size that divides the heads) of the same world
(:mod:`vpp.parallel.instances`). Every rank of both instances calls it with its own
:class:`~vpp.runtime.pipeline.Pipeline`:

1. one exchange over the world: each rank says which cache tensors it holds (prefill: every tensor
   of its stages' layers, with shapes and dtype per request) or needs (decode: its layers, its KV
   heads, with the shapes and dtype its model caches: ``stage.cache_shapes()``), from
   ``stage.cache_slices()``; the prefill instance's first rank adds a small ``payload`` (the tokens
   sampled so far, a sampler's state). Another model on the decode instance (layers, cache tensors,
   widths, heads, dtype) or a request it already holds is refused here, the same on every rank
   (:func:`compatibility_problem`), before any byte moves;
2. the same pure plan on every rank (:func:`vpp.kv.transfer_plan.plan_transfers`): each slice a
   decode rank needs comes from exactly one prefill rank, every byte once;
3. point to point over the world: prefill ranks only send, decode ranks only receive (no rank both
   sends and receives, so posting everything at once cannot deadlock on gloo), in plan order on both
   sides; every wait is bounded by a :class:`~vpp.runtime.watchdog.Watchdog` naming the peer;
4. decode ranks install the received tensors as the requests' caches (``stage.import_cache``, sized
   for ``reserve`` more tokens) and prefill ranks free theirs (``release``).

Decoding then continues on the decode pipeline exactly as it would have on the prefill's.

With context parallelism on either side (``groups.cp`` of several ranks, each holding the rows of its
own tokens; ``Stage.cache_positions`` says which): the prefill ranks of CP rank ``c`` are the sources
of one plan per ``c``, posted in CP rank order. The tokens each decode CP rank will hold are a pure
function of the prefill's shards (:func:`vpp.kv.token_rows.reader_shards`: the same shards when both
CP sizes agree, every token in order on a decode instance without CP, else a head-tail split); a
prefill rank sends each decode rank only the rows of its shard that decode rank holds
(``index_select`` along the token dim) and the decode rank puts them at its rows (``index_copy_``).
Nothing is gathered on the prefill side: no rank there ever holds more than its shard, and every row
a decode rank needs arrives once. A context-parallel decode rank installs its rows with every CP
rank's positions (``Stage.import_cache(..., positions=...)``) and decodes as after a CP prefill.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import torch
import torch.distributed as dist

from vpp.parallel.instances import Disaggregation
from vpp.kv.token_rows import coverage_problem, from_runs, reader_shards, rows_between, to_runs
from vpp.kv.transfer_plan import Holding, Piece, Transfer, plan_transfers
from vpp.transformer.attention.cache import shape_problem

from vpp.runtime.watchdog import Watchdog, rendezvous


@dataclass(frozen=True)
class HandoverInfo:
    """What one rank tells the others before a hand-over."""

    global_rank: int
    role: str
    pieces: tuple[Piece, ...]
    shapes: dict = field(default_factory=dict)  # request -> name -> (shape, dtype), on prefill ranks
    tokens: dict = field(default_factory=dict)  # request -> cached tokens, on prefill ranks
    payload: Any = None
    run_key: str = ""
    problem: str | None = None
    num_layers: int = 0  # of the rank's model (its pipeline's layout)
    expects: dict = field(default_factory=dict)  # name -> (shape, None at the token dim; dtype), on decode ranks
    held: tuple = ()  # requests holding caches on this rank, on decode ranks
    cp: tuple[int, int] = (0, 1)  # (CP rank, CP size) of this rank's instance
    positions: dict = field(default_factory=dict)  # request -> runs of the tokens of its rows, on CP prefill ranks


@dataclass
class HandoverReport:
    """One rank's view of a hand-over: bytes it sent and received, the bytes of the caches it holds
    for the requests afterwards (decode ranks: what it received; tokens x bytes per token, not the
    allocation), the wall time on this rank (``seconds``: the exchange included; ``transfer_s``: from
    the plan to the caches installed) and the prefill side's ``payload``."""

    requests: list
    tokens: dict
    bytes_sent: int
    bytes_received: int
    cache_bytes: int
    seconds: float
    payload: Any
    transfers: int
    transfer_s: float = 0.0


def pieces_of(stages: Sequence[torch.nn.Module]) -> tuple[Piece, ...]:
    """The cache tensors ``stages`` hold per request, as plan pieces (from ``stage.cache_slices()``)."""
    out = []
    for stage in stages:
        for name, sl in stage.cache_slices().items():
            out.append(Piece.whole(name) if sl is None else Piece(name, *sl))
    return tuple(out)


def cache_shapes_of(stages: Sequence[torch.nn.Module]) -> dict:
    """Name -> (shape with None at the token dim, dtype name) of every cache tensor ``stages`` hold."""
    out = {}
    for stage in stages:
        out.update(stage.cache_shapes())
    return out


def compatibility_problem(prefill_ranks: Sequence[int], decode_ranks: Sequence[int], by_rank: dict) -> str | None:
    """Why the prefill instance's caches cannot become the decode instance's, or None: the same on every
    rank (it reads only the exchanged :class:`HandoverInfo`). Another model on the decode instance (its
    layer count, its cache tensors, their widths, heads or dtype) would decode garbage, or fail on the
    decode ranks alone after the prefill ranks freed the caches; a request the decode instance already
    holds (handed over twice) could not be installed."""
    first, decode = by_rank[prefill_ranks[0]], by_rank[decode_ranks[0]]
    for r in prefill_ranks:
        if by_rank[r].tokens != first.tokens:
            return (f"the prefill ranks disagree on the requests to hand over (request -> cached tokens): global rank "
                    f"{prefill_ranks[0]} gives {first.tokens}, global rank {r} {by_rank[r].tokens}")
    if first.num_layers != decode.num_layers:
        return (f"the decode instance's model has {decode.num_layers} layers, the prefill instance's "
                f"{first.num_layers}: a KV hand-over needs the same model on both")
    held = {p.name for r in prefill_ranks for p in by_rank[r].pieces}
    needed = {p.name for r in decode_ranks for p in by_rank[r].pieces}
    if held != needed:
        extra, missing = sorted(held - needed), sorted(needed - held)
        return (f"the decode instance's model needs {len(missing)} cache tensors the prefill instance does not hold "
                f"{missing[:2]} and not {len(extra)} that it holds {extra[:2]}: a KV hand-over needs the same "
                f"model on both")
    cp = first.cp[1]
    for q in first.tokens:
        runs = [_first_of_cp(prefill_ranks, by_rank, c).positions[q] for c in range(cp)] if cp > 1 else None
        problem = runs and coverage_problem(runs, first.tokens[q])
        if problem:
            return f"request {q!r}: the prefill's {cp} CP ranks do not hold each token once: {problem}"
        shapes = {}
        for r in prefill_ranks:
            shapes.update(by_rank[r].shapes[q])
        for r in decode_ranks:
            info = by_rank[r]
            if q in info.held:
                return (f"request {q!r} already holds caches on the decode instance (global rank {r}): release it "
                        f"there before handing it over again")
            dims = {p.name: p.dim for p in info.pieces}
            for name in sorted(info.expects):
                problem = shape_problem(name, *shapes[name], *info.expects[name], sliced_dim=dims[name])
                if problem:
                    return (f"request {q!r} cannot go to global rank {r} (decode): {problem}; a KV hand-over needs "
                            f"the same model on both instances")
    return None


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.replace("torch.", ""))


def prefill_shards(prefill_ranks: Sequence[int], by_rank: dict, request: Hashable) -> list[torch.Tensor]:
    """The tokens of each prefill CP rank's rows of ``request`` (one shard of every token without CP;
    every rank of a CP rank holds the same tokens)."""
    first = by_rank[prefill_ranks[0]]
    if first.cp[1] == 1:
        return [torch.arange(first.tokens[request])]
    return [from_runs(_first_of_cp(prefill_ranks, by_rank, c).positions[request]) for c in range(first.cp[1])]


def _first_of_cp(prefill_ranks: Sequence[int], by_rank: dict, c: int):
    """The first prefill rank's info of CP rank ``c`` (every rank of a CP rank holds the same tokens)."""
    return next(by_rank[r] for r in prefill_ranks if by_rank[r].cp[0] == c)


@dataclass(frozen=True)
class Rows:
    """Which rows of a request move between the prefill's CP shards and the decode's: ``shards`` (the
    prefill's), ``decode`` (each decode CP rank's tokens), ``tokens``."""

    shards: list
    decode: list
    tokens: int

    def between(self, c: int, d: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(prefill rows, decode rows) from shard ``c`` to decode CP rank ``d``; None: every row, in
        order, on both sides (no reordering needed)."""
        src, dst = self.shards[c], self.decode[d]
        if len(src) == len(dst) and torch.equal(src, dst):
            return None
        return rows_between(src, dst, self.tokens)


def local_caches(pipe, request: Hashable) -> dict[str, torch.Tensor]:
    """This rank's caches of ``request`` (views); under CP its shard (rows of its own tokens)."""
    kw = {"shard": True} if pipe.groups.cp.size > 1 else {}
    out: dict[str, torch.Tensor] = {}
    for stage in pipe.stages:
        out.update(stage.export_cache(request, copy=False, **kw))
    return out


def cp_plans(prefill_ranks: Sequence[int], decode_ranks: Sequence[int], by_rank: dict) -> list[list[Transfer]]:
    """One plan per CP rank of the prefill instance (one plan without CP): the sources of plan ``c`` are
    the prefill ranks of CP rank ``c``, each holding that shard's rows of its pieces."""
    cp = by_rank[prefill_ranks[0]].cp[1]
    destinations = [Holding(r, by_rank[r].pieces) for r in decode_ranks]
    return [plan_transfers([Holding(r, by_rank[r].pieces) for r in prefill_ranks if by_rank[r].cp[0] == c],
                           destinations) for c in range(cp)]


@torch.inference_mode()
def hand_over(pipe, link: Disaggregation, requests: Sequence[Hashable] | None, *, payload: Any = None,
              reserve: int = 0, release: bool = True, timeout_s: float | None = None,
              problem: str | None = None) -> HandoverReport:
    """Move ``requests``' caches from the prefill instance's ranks to the decode instance's (see the
    module docstring); a collective over the whole world. ``pipe`` is this rank's pipeline (prefill or
    decode); ``requests`` are given on the prefill ranks (decode ranks may pass None and learn them in
    the exchange). ``reserve``: tokens each request will still append on the decode side (its caches are
    sized for them once). Returns this rank's :class:`HandoverReport`; on every rank ``payload`` is
    the one given on the prefill instance's first rank. ``problem``: an error this rank met before
    (a failed prefill), raised as the same ValueError on every rank after the exchange."""
    timeout_s = pipe.timeout_s if timeout_s is None else timeout_s
    start = time.perf_counter()
    me, sending = link.groups.global_rank, link.is_prefill
    if problem is None and pipe.stopped is not None:  # told to every rank in the exchange
        problem = f"global rank {me} cannot hand over: {pipe.stopped}; start the ranks anew"
    shapes, counts, positions = {}, {}, {}
    if sending and problem is None:
        if requests is None:
            problem = f"global rank {me}: a prefill rank must name the requests to hand over"
        for q in requests or ():
            local = local_caches(pipe, q)
            if not local:
                problem = problem or f"global rank {me}: request {q!r} has no caches on this prefill rank to hand over"
                continue
            shapes[q] = {n: (tuple(t.shape), str(t.dtype)) for n, t in local.items()}
            counts[q] = pipe.stages[0].cache_length(q)
            if pipe.groups.cp.size > 1:  # the tokens of this rank's shard's rows
                positions[q] = to_runs(pipe.stages[0].cache_positions(q))
    mine = HandoverInfo(me, link.role, pieces_of(pipe.stages), shapes, counts,
                        payload if me == link.prefill_ranks[0] else None, os.urandom(8).hex(), problem,
                        pipe.layout.num_layers, {} if sending else cache_shapes_of(pipe.stages),
                        () if sending else tuple({q for st in pipe.stages for q in st.requests()}),
                        (link.groups.cp.rank, link.groups.cp.size), positions)
    world = link.prefill_ranks + link.decode_ranks
    rendezvous("the KV hand-over's exchange", me, world, timeout_s=timeout_s)
    infos: list[Any] = [None] * len(world)
    dist.all_gather_object(infos, mine)
    by_rank = {i.global_rank: i for i in infos}
    problem = (next((i.problem for i in infos if i.problem), None)
               or compatibility_problem(link.prefill_ranks, link.decode_ranks, by_rank))
    if problem:  # the same on every rank, before any transfer
        raise ValueError(problem)
    requests = list(by_rank[link.prefill_ranks[0]].tokens)
    plans = cp_plans(link.prefill_ranks, link.decode_ranks, by_rank)
    plan = [t for p in plans for t in p]
    watchdog = Watchdog(f"{by_rank[link.prefill_ranks[0]].run_key}/handover", me, timeout_s=timeout_s,
                        pollable=link.groups.accelerator.backend != "gloo", global_ranks=tuple(range(len(world))),
                        label="global rank")
    sent = received = held = 0
    tokens = {}
    moving = time.perf_counter()
    cp_of = {r: i.cp[0] for r, i in by_rank.items()}
    try:
        warm_pairs(plan, me, link.groups.device, watchdog, timeout_s=timeout_s)
        for q in requests:
            tokens[q] = by_rank[link.prefill_ranks[0]].tokens[q]
            shards = prefill_shards(link.prefill_ranks, by_rank, q)
            rows = Rows(shards, reader_shards(shards, tokens[q], by_rank[link.decode_ranks[0]].cp[1]), tokens[q])
            if sending:
                sent += _send(pipe, q, plans[cp_of[me]], me, watchdog,
                              lambda dst: rows.between(cp_of[me], cp_of[dst]))
                if release:
                    pipe.release(q)
            elif any(t.dst == me for t in plan):
                shapes = {}
                for r in link.prefill_ranks:
                    shapes.update(by_rank[r].shapes[q])
                tensors, nbytes = _receive(q, plans, me, by_rank[me].expects, shapes, rows, cp_of,
                                           link.groups.device, watchdog)
                received += nbytes
                held += sum(t.nbytes for t in tensors.values())
                install_caches(pipe, q, tensors, tokens[q] + reserve,
                               rows.decode if link.groups.cp.size > 1 else None)
    except BaseException as exc:
        watchdog.notify_failure(f"global rank {me} ({link.role}) raised {type(exc).__name__}: {exc} in the KV hand-over",
                                me if getattr(exc, "global_rank", None) is None else exc.global_rank)
        pipe.stop(exc, "KV hand-over")
        raise
    finally:
        watchdog.close()
    end = time.perf_counter()
    return HandoverReport(requests, tokens, sent, received, held, end - start, by_rank[link.prefill_ranks[0]].payload,
                          len(plan), end - moving)


def warm_pairs(plan: Sequence[Transfer], me: int, device: torch.device, watchdog: Watchdog, *,
               timeout_s: float) -> list[tuple[int, int]]:
    """Set up the communicator of every (source, destination) pair of the plan that this rank is in
    before the first payload moves: NCCL and HCCL create a pair's communicator inside its first
    transfer, blocking the host where nothing can raise. Pair by pair, in one order on every rank (so
    no two set-ups wait for each other in a cycle): a bounded meeting of the two in the store, which
    names a peer that never comes within ``timeout_s``, then one element from source to destination.
    Returns the pairs warmed."""
    pairs = sorted({(t.src, t.dst) for t in plan if me in (t.src, t.dst) and t.src != t.dst})
    one = torch.zeros(1, device=device)
    for src, dst in pairs:
        peer = dst if me == src else src
        rendezvous(f"the KV hand-over pair {src}->{dst}'s set-up", me, (src, dst), timeout_s=timeout_s)
        watchdog.complete(lambda: dist.isend(one, dst=dst) if me == src else dist.irecv(one, src=src),
                          f"setting up the hand-over pair {src}->{dst}", peer)
    return pairs


def _send(pipe, request: Hashable, plan: list[Transfer], me: int, watchdog: Watchdog, rows_to) -> int:
    """Post this rank's transfers of ``plan``, each the rows ``rows_to(dst)`` selects (None: all)."""
    local = local_caches(pipe, request)
    token_dim = {n: list(shape).index(None) for n, (shape, _) in cache_shapes_of(pipe.stages).items()}
    works, nbytes = [], 0
    for t in plan:
        if t.src != me:
            continue
        rows = rows_to(t.dst)
        if rows is not None and len(rows[0]) == 0:
            continue  # the destination holds none of this shard's tokens (it posts no receive either)
        x = local[t.name] if t.dim is None else local[t.name].narrow(t.dim, t.src_offset, t.length)
        if rows is None or len(rows[0]) == x.shape[token_dim[t.name]]:  # every row, in row order
            x = x.contiguous()
        else:
            x = x.index_select(token_dim[t.name], rows[0].to(x.device))
        nbytes += x.nbytes
        what = f"sending {t.name} of request {request!r} to global rank {t.dst}"
        works.append((watchdog.post(lambda: dist.isend(x, dst=t.dst), what, t.dst), what, t, x))  # x: alive until sent
    for work, what, t, _ in works:
        watchdog.wait(work, what, t.dst)
    return nbytes


def _receive(request: Hashable, plans: list[list[Transfer]], me: int, expects: dict, shapes: dict, rows: Rows,
             cp_of: dict, device: torch.device, watchdog: Watchdog) -> tuple[dict[str, torch.Tensor], int]:
    """This decode rank's caches of ``request`` (its layers, heads and tokens, in its row order) from
    every prefill CP shard's plan, posted in CP rank order; and the bytes received."""
    mine = rows.decode[cp_of[me]]
    tensors = {}
    for name, (shape, _) in expects.items():
        tensors[name] = torch.empty([len(mine) if n is None else n for n in shape], dtype=_dtype(shapes[name][1]),
                                    device=device)
    works = []
    for c, plan in enumerate(plans):
        moved = rows.between(c, cp_of[me])
        for t in plan:
            if t.dst != me or (moved is not None and len(moved[0]) == 0):
                continue
            dim = list(expects[t.name][0]).index(None)
            view = tensors[t.name] if t.dim is None else tensors[t.name].narrow(t.dim, t.dst_offset, t.length)
            if moved is None:
                buf = view if view.is_contiguous() else torch.empty_like(view, memory_format=torch.contiguous_format)
            else:
                shape = list(view.shape)
                shape[dim] = len(moved[0])
                buf = view.new_empty(shape)
            what = f"receiving {t.name} of request {request!r} from global rank {t.src}"
            works.append((watchdog.post(lambda: dist.irecv(buf, src=t.src), what, t.src), what, t, view, buf,
                          None if moved is None else (dim, moved[1])))
    nbytes = 0
    for work, what, t, view, buf, at in works:
        watchdog.wait(work, what, t.src)
        nbytes += buf.nbytes
        if at is not None:
            view.index_copy_(at[0], at[1].to(view.device), buf)
        elif buf is not view:
            view.copy_(buf)
    return tensors, nbytes


def install_caches(pipe, request: Hashable, tensors: dict[str, torch.Tensor], tokens: int,
                   positions: list[torch.Tensor] | None = None) -> None:
    """Size ``request``'s caches on this rank's stages for ``tokens`` tokens, then import them (under
    CP, this rank's rows; ``positions``: every CP rank's tokens)."""
    kw = {} if positions is None else {"positions": positions}
    for stage in pipe.stages:
        stage.reserve(request, tokens)
        start, end = stage.layer_range
        stage.import_cache(request, {k: v for k, v in tensors.items() if start <= int(k.split(".")[2]) < end}, **kw)


__all__ = ["HandoverInfo", "HandoverReport", "Rows", "cache_shapes_of", "compatibility_problem", "cp_plans",
           "hand_over", "install_caches", "local_caches", "pieces_of", "prefill_shards", "warm_pairs"]
