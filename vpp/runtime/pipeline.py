"""The pipeline object an inference loop holds: built once per rank, it prefills prompt after prompt
and decodes from the caches the prefill left.

``Pipeline(stages, groups)`` makes the world-wide start-up exchange once (every rank learns the
layout the stage modules form and their shapes; a mismatch is the same error on every rank) and keeps
a cache of verified plans keyed by (schedule, requests' chunk sizes and arrivals, concurrency). A
prefill then costs one small exchange of the prompts' lengths (only the ranks that hold stage 0 are
given the prompts), a plan lookup, and the run. :mod:`.api`'s ``forward_*_prefill`` functions are
one-shot wrappers over it.

Decoding (:meth:`Pipeline.decode`, :meth:`Pipeline.generate`) runs one batch of tokens, one per live
request, through the stages in stage order (on a V the batch goes down the ranks and back up) and
broadcasts the next-token logits from the rank holding the last stage to every rank of the
pipeline, so every rank samples the same next tokens (:mod:`.sampling`, seeded alike everywhere).
See :mod:`.decode`.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Sequence

import torch
import torch.distributed as dist

from vpp.parallel.groups import ParallelGroups
from vpp.schedules import strategies
from vpp.schedules.ir import Plan, Request
from vpp.schedules.layout import Layout
from vpp.schedules.verify import verify

from . import finite, handshake, inputs
from .inputs import cached_counts, requests_for
from .decode import broadcast_logits, decode_step
from .device_order import neighbours, stream_ops_for, warm_communicators
from .executor import Executor
from .layout_inference import check_stage_shapes, infer_layout
from .prefill_output import PrefillOutput
from .sampling import Sampler
from .stage_contract import check_context_parallel, check_stages
from .traces import gather_trace
from .watchdog import rendezvous


PLAN_CACHE = 64  # verified plans kept per Pipeline (each a few KB to MBs: one action per chunk and stage)


@dataclass(frozen=True)
class PromptInfo:
    """What one rank knows of a prefill's prompts (see :func:`handshake.first_problem`)."""

    prompt_lengths: tuple[int, ...] | None
    prompt_problem: str | None
    run_key: str
    global_rank: int = 0
    prompt_digest: str | None = None  # of the prompts this rank was given, stage 0 or not (None: none given)
    call: tuple[tuple[str, str], ...] = ()  # the arguments every rank gives alike (inputs.call_signature)


@dataclass
class Generation:
    """The outcome of :meth:`Pipeline.generate`, the same on every rank: ``tokens`` per request (new
    tokens only), ``ttft_s`` (hand-over of the prompts to the first tokens known on every rank) and
    ``decode_s`` (the decode steps; per output token: ``decode_s / max(steps, 1)``); ``handover_s``:
    the KV hand-over to a decode instance, when there was one (:mod:`vpp.kv.disaggregated`)."""

    tokens: dict[int, list[int]]
    ttft_s: float
    decode_s: float
    steps: int
    handover_s: float = 0.0

    @property
    def time_per_output_token_s(self) -> float:
        return self.decode_s / max(self.steps, 1)


class CacheExport(dict):
    """A rank's caches of one request (tensor name -> tensor, as ``Stage.export_cache`` names them), with
    ``model``: the (digest, name) of the model that computed them (None: unknown), and ``slices``: per name,
    the (dim, start, end, full) slice of the full tensor it holds (None: the whole tensor). Pickles with
    both."""

    def __init__(self, *args, model: tuple[str, str] | None = None, slices: dict | None = None, **kw):
        super().__init__(*args, **kw)
        self.model, self.slices = model, dict(slices or {})


class Pipeline:
    """This rank's part of a pipeline: its stage modules (in stage order), the groups, and a plan
    cache. ``timeout_s`` bounds every wait of every call (see :mod:`.watchdog`)."""

    def __init__(self, stages: Sequence[torch.nn.Module], groups: ParallelGroups, *, timeout_s: float = 300.0):
        self.timeout_s = inputs.check_timeout(timeout_s)
        if not isinstance(groups, ParallelGroups):
            raise TypeError(f"groups must be a ParallelGroups (vpp.parallel.initialize_model_parallel, or "
                            f"ParallelGroups.single()), got {type(groups).__name__}")
        if isinstance(stages, torch.nn.Module) or not isinstance(stages, Sequence):
            raise TypeError(f"stages must be a list of this rank's stage modules, got {type(stages).__name__}")
        self.stages, self.groups = list(stages), groups
        check_stages(self.stages)  # every missing member of every stage, in one error
        check_context_parallel(self.stages, groups.cp.ranks)
        infos = handshake.exchange(self.stages, groups, None, timeout_s=self.timeout_s)
        self.key, self.steps = infos[0].run_key, 0  # the same on every rank: names decode steps' notices
        self.stopped: str | None = None  # why a call stopped in the middle of its transfers (see check_usable)
        self.pipeline = handshake.pipeline_of(infos, groups)
        self.layout: Layout = infer_layout(self.pipeline)
        problem = handshake.model_disagreement(infos) or handshake.order_problem(self.pipeline, self.layout)
        if problem:  # every rank holds every descriptor: every rank raises this, before any transfer
            raise ValueError(problem)
        check_stage_shapes(self.pipeline)
        # (digest, name) of the model every rank loaded, or None where the stages cannot tell
        self.model = next((st.model for info in infos for st in info.stages if st.model is not None), None)
        self.first = next(st for info in self.pipeline for st in info.stages if st.is_first)
        self.last = next(st for info in self.pipeline for st in info.stages if st.is_last)
        self.mine = dict(zip(self.layout.stages_of(groups.pp.rank), self.stages))
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()  # least recently used first
        self._warm()

    def _warm(self) -> None:
        """On NCCL/HCCL, set up every communicator now (each group's collective one and the pairs with
        this rank's pipeline neighbours: the first call on each is a host-blocking set-up, bounded here
        by ``timeout_s``), so no prefill's TTFT includes it (:func:`.device_order.warm_communicators`)."""
        ops = stream_ops_for(self.groups)
        if ops is None:
            return
        warm_communicators(self.groups, neighbours(self.layout, self.groups.pp.rank), ops, timeout_s=self.timeout_s)
        self.groups.accelerator.synchronize(self.groups.device)

    # --- prefill ---------------------------------------------------------------------------------

    def prefill(self, input_ids: Any, chunk_size: inputs.Chunking, *, schedule: str = "vpp",
                request_ids: Sequence[int] | None = None, arrivals: Sequence[float] | None = None,
                concurrency: int | None = None, return_trace: bool = False, progress=None,
                decode_room: int = 0, cached_tokens: int | Sequence[int] = 0, steps=None) -> PrefillOutput:
        """Prefill one prompt or a stream of them (see :func:`vpp.runtime.api.forward_prefill`).
        ``decode_room``: tokens each request's caches should hold beyond its prompt (those it will
        decode), so that they are allocated once. ``cached_tokens`` (one count, or one per prompt):
        the first N tokens of a prompt are already in every stage's caches under its request id (left
        by an earlier prefill of them, or installed with :meth:`import_cache`); only the rest is
        chunked and computed, the full prompt is still given (its first N ids are not used). ``steps``:
        steps shared by several prompts, as lists of (prompt index, chunk) (e.g. from
        :func:`vpp.schedules.shared_budget.shared_budget_stream`), each moved as one message per hop."""
        self.check_usable()
        strategy = strategies.get(schedule, strategies.PLANNED)
        chunk_size = inputs.check_chunking(chunk_size)
        if strategy.chunking == "dcpp" and isinstance(chunk_size, int):
            raise ValueError(f"schedule {schedule!r} takes its chunk sizes from a DCPP planner: call "
                             f"forward_dcpp_prefill, or pass planner.chunk_sizes as chunk_size")
        if concurrency is not None and (not inputs.is_count(concurrency) or concurrency < 1):
            raise ValueError(f"concurrency={concurrency!r} must be a positive integer or None")
        prompts, problem = inputs.as_prompts(input_ids)
        if request_ids is not None and not isinstance(request_ids, (str, bytes)) and isinstance(request_ids, Iterable):
            request_ids = list(request_ids)  # a generator is read once, here
        call = inputs.call_signature(schedule=schedule, chunk_size=chunk_size, request_ids=request_ids,
                                     arrivals=arrivals, concurrency=concurrency, return_trace=return_trace,
                                     decode_room=decode_room, cached_tokens=cached_tokens, steps=steps)
        infos = self._exchange_prompts(prompts, problem, self._held_problem(prompts, request_ids, cached_tokens),
                                       call)
        problem = (handshake.disagreement(infos) or inputs.call_disagreement(infos)
                   or handshake.first_problem(infos))
        if problem:
            raise ValueError(problem)
        lengths = handshake.prompt_lengths(infos)
        ids = inputs.check_request_ids(request_ids if request_ids is not None else range(len(lengths)), len(lengths))
        cached = cached_counts(cached_tokens, len(lengths))
        limit = self.first.max_positions
        if decode_room and limit is not None and max(lengths) + decode_room > limit:  # before any work
            raise ValueError(f"a prompt of {max(lengths)} tokens and {decode_room} tokens to decode after it "
                             f"(max_new_tokens={decode_room + 1}) exceed the model's {limit} positions")
        if any(cached):
            self._check_cached(ids, cached, lengths)
        if steps is not None:
            steps = inputs.check_steps(steps, ids)
        plan = self.plan(schedule, requests_for(lengths, chunk_size, ids, arrivals, cached), concurrency, steps)
        executor = Executor(plan, self.mine, self.groups, self.pipeline, run_key=infos[0].run_key,
                            timeout_s=self.timeout_s, progress=progress, timed=return_trace,
                            extra_tokens=decode_room)
        by_id = dict(zip(ids, prompts)) if prompts is not None else {}
        if (return_trace or arrivals is not None) and dist.is_initialized() and self.groups.sizes.world_size > 1:
            # traces and arrival times share an origin: start every rank together
            rendezvous("the start barrier", self.groups.global_rank, self.groups.members, timeout_s=self.timeout_s)
            dist.barrier(group=self.groups.instance_pg)
        self.groups.accelerator.synchronize(self.groups.device)  # the clock starts on an idle device
        start = time.perf_counter()
        try:
            try:
                result = executor.run(by_id)
            except BaseException as exc:
                self.stop(exc, "prefill")
                raise
            wall = time.perf_counter() - start
            self.check_finite(result.nonfinite, "prefill")
        except BaseException:
            for q in ids:  # a failed prefill keeps no caches (one stopped mid-transfer: see stop)
                self.release(q)
            raise
        trace = gather_trace(result, self.groups, plan, timeout_s=self.timeout_s) if return_trace else None
        return PrefillOutput(result.logits.get(ids[0]), result.logits, plan, result, trace, wall)

    def stop(self, exc: BaseException, what: str) -> None:
        """Record that a ``what`` failed in the middle of its transfers: a receive abandoned on one rank
        (gloo cannot cancel one) takes the next message its peer sends on that channel, and a send
        that found no receive is taken by the peer's next one, so a later call would time out, or read
        one step's tensor as another's. Every later call on this rank is refused (:meth:`check_usable`).
        One process moves nothing: nothing to record."""
        if dist.is_initialized() and len(self.groups.members) > 1 and self.stopped is None:
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.stopped = f"a {what} stopped in the middle of its transfers ({type(exc).__name__}: {first})"

    def check_usable(self) -> None:
        """Refuse any call after :meth:`stop`, on every rank that stopped (one line)."""
        if self.stopped is not None:
            raise RuntimeError(f"this pipeline cannot run again on global rank {self.groups.global_rank}: "
                               f"{self.stopped}; a transfer left behind would take the next one's place: start the "
                               f"ranks (and their process groups) anew")

    def check_finite(self, local: list, what: str) -> None:
        """Share every rank's non-finite (stage, request) pairs and raise the same
        :class:`~.finite.NonFiniteError` everywhere if there is any (see :mod:`.finite`)."""
        local = [(s, q, self._nonfinite_layer(s, q)) for s, q in local]  # only after a non-finite run
        found = [local]
        if dist.is_initialized() and len(self.groups.members) > 1:
            rendezvous(f"the finiteness exchange after the {what}", self.groups.global_rank, self.groups.members,
                       timeout_s=self.timeout_s)
            found = [None] * len(self.groups.members)
            dist.all_gather_object(found, local, group=self.groups.instance_pg)
        first = finite.first_nonfinite(found)
        if first is not None:
            finite.raise_nonfinite(first, self.layout, dict(enumerate(self.layout.stage_layers)), what=what)

    def _nonfinite_layer(self, stage: int, request: int) -> int | None:
        ask = getattr(self.mine.get(stage), "nonfinite_layer", None)  # optional in the stage contract
        return ask(request) if ask is not None and request is not None else None

    def plan(self, schedule: str, requests: Sequence[Request], concurrency: int | None = None,
             steps=None) -> Plan:
        """The verified plan of ``schedule`` for ``requests`` (built once per distinct chunking)."""
        key = (schedule, tuple((q.id, q.chunk_sizes, q.arrival, q.cached) for q in requests), concurrency, steps)
        if key not in self._plans:
            spec = strategies.get(schedule, strategies.PLANNED)
            self._plans[key] = verify(spec.plan(self.layout, requests, concurrency=concurrency, steps=steps))
            while len(self._plans) > PLAN_CACHE:  # a server sees endless distinct chunkings: keep memory flat
                self._plans.popitem(last=False)
        self._plans.move_to_end(key)
        return self._plans[key]

    def _check_cached(self, ids, cached, lengths) -> None:
        """Every stage of every rank must hold exactly the cached prefix of each request: one problem
        (the first, in rank order) is raised the same on every rank."""
        problem = None
        for q, c, n in zip(ids, cached, lengths):
            if c >= n:
                problem = f"request {q!r}: cached_tokens={c} leaves nothing to prefill of its {n}-token prompt"
                break
            bad = [(st, st.cache_length(q)) for st in self.stages if st.cache_length(q) != c]
            if bad:
                st, have = bad[0]
                problem = (f"request {q!r}: cached_tokens={c}, but stage {st.layer_range} on global rank "
                           f"{self.groups.global_rank} holds {have} tokens of it in its caches")
                break
        problems = [problem]
        if dist.is_initialized() and self.groups.sizes.world_size > 1:
            rendezvous("the cached prefixes' check", self.groups.global_rank, self.groups.sizes.world_size,
                       timeout_s=self.timeout_s)
            problems = [None] * self.groups.sizes.world_size
            dist.all_gather_object(problems, problem)
        first = next((p for p in problems if p), None)
        if first:
            raise ValueError(first)

    def _held_problem(self, prompts, request_ids, cached_tokens) -> str | None:
        """On a rank given the prompts: a request prefilled without ``cached_tokens`` that already holds
        caches on this rank's stages (a second prefill of a live request would fail in the
        middle of the plan, and its clean-up would then free the first one's caches). Carried through
        the prompts' exchange, so every rank raises it before any work."""
        if prompts is None:
            return None
        try:
            ids = inputs.check_request_ids(request_ids if request_ids is not None else range(len(prompts)),
                                           len(prompts))
            cached = cached_counts(cached_tokens, len(prompts))
        except ValueError:
            return None  # raised alike on every rank after the exchange
        for q, c in zip(ids, cached):
            if c:  # a cached prefix is checked on every rank by _check_cached
                continue
            for st in self.stages:
                have = st.cache_length(q)
                if have:
                    return (f"request {q!r} already holds {have} tokens in the caches of stage {list(st.layer_range)} "
                            f"on global rank {self.groups.global_rank} (cached_tokens={c}): release it first, or "
                            f"pass cached_tokens={have} to continue it")
        return None

    def _exchange_prompts(self, prompts, problem, held_problem: str | None = None,
                          call: tuple = ()) -> list[PromptInfo]:
        lengths = None
        if prompts is not None and any(m.is_first for m in self.stages):
            lengths = tuple(int(p.numel()) for p in prompts)
            problems = [handshake.check_prompt(p, self.first, f"prompt {i}" if len(prompts) > 1 else "prompt")
                        for i, p in enumerate(prompts)]
            problem = problem or next((p for p in problems if p), None)
        problem = problem or held_problem
        digest = handshake.prompts_digest(prompts) if prompts is not None else None
        mine = PromptInfo(lengths, problem, os.urandom(8).hex(), self.groups.global_rank, digest, call)
        if not dist.is_initialized() or self.groups.sizes.world_size == 1:
            return [mine]
        rendezvous("the prompts' exchange", self.groups.global_rank, self.groups.members, timeout_s=self.timeout_s)
        out: list[Any] = [None] * self.groups.sizes.world_size
        dist.all_gather_object(out, mine, group=self.groups.instance_pg)
        return out

    # --- decode ----------------------------------------------------------------------------------

    def next_logits(self, output: PrefillOutput, request_ids: Sequence[int]) -> torch.Tensor:
        """The prefill's last-token logits of ``request_ids`` as [B, vocab] float32 on every rank."""
        self.check_usable()
        local = None
        if output.all_logits:
            local = torch.stack([output.all_logits[q].reshape(-1) for q in request_ids])
        return broadcast_logits(self, local, len(request_ids))

    def decode(self, tokens: torch.Tensor, request_ids: Sequence[int]) -> torch.Tensor:
        """Append one token per request (``tokens`` [B], the same on every rank) to its caches and
        return the next-token logits [B, vocab] (float32) on every rank."""
        self.check_usable()
        return decode_step(self, tokens, list(request_ids))

    def release(self, request: int) -> None:
        """Free every cache ``request`` holds on this rank's stages."""
        for stage in self.stages:
            stage.release(request)

    def export_cache(self, request: Hashable) -> "CacheExport":
        """This rank's caches of ``request`` as plain tensors (see ``Stage.export_cache`` for the
        layout): what an engine takes over to continue decoding elsewhere. The dict carries the model it
        belongs to and the slice of each full tensor it holds (:class:`CacheExport`)."""
        out = CacheExport(model=self.model, slices=self._slices())
        for stage in self.stages:
            out.update(stage.export_cache(request))
        return out

    def _slices(self) -> dict:
        return {n: (tuple(v) if v is not None else None) for st in self.stages
                for n, v in getattr(st, "cache_slices", dict)().items()}

    def _shapes_agree(self, tensors) -> bool:
        from vpp.transformer.attention.cache import shape_problem
        shapes = {n: v for st in self.stages for n, v in getattr(st, "cache_shapes", dict)().items()}
        return all(shape_problem(n, t.shape, str(t.dtype), *shapes[n]) is None for n, t in tensors.items() if n in shapes)

    def import_cache(self, request: Hashable, tensors: "CacheExport") -> None:
        """Install a request's caches exported (:meth:`export_cache`) by a pipeline of the same model,
        layout and TP rank (for another layout: :func:`vpp.kv.handover.hand_over`, or :mod:`vpp.kv.files`
        through a directory). Another model's export, or another TP rank's slices, are refused in one
        line before anything is installed."""
        if not isinstance(tensors, CacheExport):
            raise TypeError(f"import_cache takes what Pipeline.export_cache returned (it carries the model and the "
                            f"slices it holds), got {type(tensors).__name__}")
        if (tensors.model is not None and self.model is not None and tensors.model[0] != self.model[0]
                and self._shapes_agree(tensors)):  # (other shapes: the stages name the tensor that differs)
            raise ValueError(f"request {request!r}: the caches were exported by model {tensors.model[1]} (digest "
                             f"{tensors.model[0]}), this pipeline runs {self.model[1]} (digest {self.model[0]})")
        mine = self._slices()
        other = next((n for n in tensors if n in mine and tensors.slices.get(n, mine[n]) != mine[n]), None)
        if other is not None:
            raise ValueError(f"request {request!r}: {other} was exported as slice (dim, start, end, full) "
                             f"{tensors.slices[other]}, this rank holds {mine[other]}: another TP rank's export")
        for stage in self.stages:
            start, end = stage.layer_range
            mine = {k: v for k, v in tensors.items() if start <= int(k.split(".")[2]) < end}
            stage.import_cache(request, mine)

    def generate(self, prompts: Any, max_new_tokens: int, chunk_size: inputs.Chunking, *, schedule: str = "vpp",
                 sampler: Sampler | None = None, request_ids: Sequence[int] | None = None,
                 eos_token_id: int | None = None, release: bool = True, on_tokens=None,
                 cached_tokens: int | Sequence[int] = 0) -> Generation:
        """Prefill ``prompts`` with ``schedule``, then decode up to ``max_new_tokens`` tokens per request,
        all live requests in one batch per step (a request stops at ``eos_token_id``). Greedy unless a
        :class:`~.sampling.Sampler` says otherwise. ``prompts`` are given on the ranks holding stage 0
        (``None`` elsewhere), as for :meth:`prefill`. ``on_tokens(tokens)`` is called after every step
        with the tokens so far (request id -> list), e.g. to stream them. ``cached_tokens``: as for
        :meth:`prefill` (the TTFT then covers the rest of the prompt only)."""
        if not inputs.is_count(max_new_tokens) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
        sampler = sampler or Sampler()
        if not isinstance(sampler, Sampler):
            raise ValueError(f"sampler must be a vpp.runtime.Sampler or None (greedy), got {type(sampler).__name__}")
        start = time.perf_counter()
        out = self.prefill(prompts, chunk_size, schedule=schedule, request_ids=request_ids,
                           decode_room=max_new_tokens - 1, cached_tokens=cached_tokens)
        ids = [q.id for q in out.plan.requests]
        try:  # released also when decoding or ``on_tokens`` raises: no caches stay behind a failed call
            tokens = sampler.sample(self.next_logits(out, ids))
            ttft = time.perf_counter() - start
            generated = {q: [int(t)] for q, t in zip(ids, tokens)}
            if on_tokens is not None:
                on_tokens(generated)
            steps, decode_s = self.continue_generation(generated, max_new_tokens, sampler,
                                                       eos_token_id=eos_token_id, on_tokens=on_tokens)
        finally:
            if release:
                for q in ids:
                    self.release(q)
        return Generation(generated, ttft, decode_s, steps)

    def continue_generation(self, generated: dict[int, list[int]], max_new_tokens: int, sampler: Sampler, *,
                            eos_token_id: int | None = None, on_tokens=None) -> tuple[int, float]:
        """Decode the requests of ``generated`` (request id -> the tokens generated so far, the last one
        not yet in the caches) until each has ``max_new_tokens`` tokens or ends with ``eos_token_id``,
        all live requests in one batch per step; appends to ``generated`` in place. Returns the decode
        steps run and their seconds."""
        live = [q for q, t in generated.items() if t[-1] != eos_token_id and len(t) < max_new_tokens]
        steps, decode_start = 0, time.perf_counter()
        while live:
            batch = torch.tensor([generated[q][-1] for q in live], dtype=torch.long)
            tokens = sampler.sample(self.decode(batch, live))
            steps += 1
            for q, t in zip(live, tokens):
                generated[q].append(int(t))
            live = [q for q in live if generated[q][-1] != eos_token_id and len(generated[q]) < max_new_tokens]
            if on_tokens is not None:
                on_tokens(generated)
        return steps, time.perf_counter() - decode_start


__all__ = ["CacheExport", "Generation", "PLAN_CACHE", "Pipeline", "PromptInfo", "cached_counts", "requests_for"]
