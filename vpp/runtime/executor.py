"""The executor: runs a :class:`~vpp.schedules.ir.Plan` on real ranks with real stage modules.

It interprets the IR and nothing else (see :mod:`vpp.schedules.ir` for the semantics of each action and of the
two communication modes). This rank runs ``plan.actions[pp_rank]`` in order:

* ``F`` COMPUTE  -- stage ``s`` on chunk ``c`` of request ``q``: its input is the prompt slice (stage 0)
  or stage ``s-1``'s output (received or handed over; in async mode the compute first waits for the
  receive). The stage reads and extends its own KV cache for ``q``. The last stage keeps the
  last-token logits of the request's last chunk.
* ``S``/``R`` SEND/RECV -- point-to-point on the directional pipeline channel of
  :meth:`ParallelGroups.pp_channel`; receive buffers are sized per chunk (the last one is ragged).
  Blocking mode waits at once; async mode posts and waits where the data is needed (receives); a send
  holds its buffer only until it completes (:class:`~.sends.SendQueue`), and the plan's end waits for
  the rest.
* ``L`` HANDOFF  -- nothing moves: the output stays in this rank's activation table for stage s+1.

Context parallelism (``groups.cp`` of several ranks): every stage runs on a CP group, each of its
ranks holding its share of every chunk (the head-tail split of
:class:`~vpp.transformer.attention.context_parallel.Split`). Each CP rank runs the same plan; its
pipeline group (``groups.pp``, the ranks of equal tp/cp coordinates) connects it to the MATCHING CP
rank of every other stage, so a transfer carries this CP rank's rows of the chunk only (never the
gathered chunk): receive buffers hold :meth:`Executor.rows` rows, and a later stage is called with
``chunk_tokens=`` the chunk's size so that it knows the split. Stage 0 takes the whole chunk's ids
and keeps its share; the last stage's ``last_token_only`` logits come from the CP rank holding the
last token (broadcast over the CP group inside the stage). CP collectives run on ``groups.cp``, the
pipeline's two directions on ``groups.pp`` / ``groups.pp_up``: three communicators.

Steps shared by requests (``Plan.steps``): a step's lead SEND concatenates the outputs of the step's
pieces (in step order) into ONE message and the lead RECV receives it into one buffer, which the
step's first compute splits into the pieces' inputs (views, no copy). Each piece is still one stage
call: a stage's KV caches are keyed by request and a call extends one request's cache, so a batched
call would need a variable-length attention over several requests' caches; what the split costs is
the stage call's fixed overhead per extra piece, which is what the simulator saves per piece
(:func:`vpp.schedules.cost.step_overhead`) only where the cost model states it (on these CPU ranks the
per-call overhead is tens of microseconds against milliseconds of compute). The paper-scale cost model
can also price a shared step as one batched forward (``Setup.batched_steps``, :mod:`vpp.perf.batched`),
which these ranks do not run.

Request streams (see :mod:`vpp.schedules.ir`): before stage 0 computes a request's first chunk, the executor sleeps
until the request's arrival (seconds after the start barrier, the trace's origin) and, under a
concurrency limit, until the gating request has finished. Where that request's last stage lives on
another rank, the rank holding it posts a completion notice in the process group's store.

Every wait goes through a :class:`~.watchdog.Watchdog`: a rank that raises posts a notice naming itself
and its action, and the others stop within ``poll_s``; a rank that dies breaks the connection; a rank
that hangs trips ``timeout_s``. Nothing hangs.

Two paths, chosen by the pipeline's process group (:mod:`.device_order`):

* gloo (the host moves the data): the host waits where the IR says the data is needed, as above.
* NCCL / HCCL (the device orders the work): the executor only enqueues. It posts every SEND/RECV in
  plan order (the plan lists a receive ahead of the compute that precedes its consumer, so on the pair
  communicator's stream it is in flight while that compute runs); a compute that consumes a receive is
  ordered after it by ``Work.wait()`` on the current stream; a blocking-mode transfer is ordered the
  same way before the next compute (the device serialises, the host does not wait); a send's buffer is
  dropped once its work's end event reports done. The host waits for the device only to stay at most
  :data:`~.device_order.RUN_AHEAD_COMPUTES` computes ahead (an event of an earlier compute, never a
  transfer) and once at the end of the plan. Faults: a :class:`~.watchdog.WorkWatch` thread checks the
  outstanding transfers against ``timeout_s`` and the store's failure notices, and the rank's thread
  raises what it found between actions and while it waits for the device; after a fault the rank
  aborts its communicators (``ops.abort()``). Where a process group runs its transfers on one stream
  (eager NCCL, HCCL: ``ops.fuses``) a step's run of SEND/RECV actions is posted as one batch per channel.

Idle gaps (both paths): a receive of a request that has not arrived yet is not posted where the plan
lists it but when its consumer needs it and the request has arrived (the sender cannot send earlier),
in order per channel and peer: no deadline (vpp's, or the process group's own, which NCCL starts at
enqueue) runs through a gap between requests, however long.

Devices. Everything the executor allocates (the prompt, receive buffers) lives on the rank's device
(``groups.device``); the prompt moves there once per run. Nothing in the per-chunk path waits for the
device: compute spans are timed with device events when ``timed`` (:mod:`.timing`, one
synchronisation after the run), and the KV caches of a request are reserved at its full length before
its first chunk (stages that offer ``reserve(request, tokens)``, an optional part of the stage
contract), so they are allocated once.

The executor records the simulator's trace format (:mod:`vpp.schedules.trace`): compute spans, blocked send/recv
spans, spans for posting non-blocking ops (gloo may move the data in the posting thread, so posting
can take as long as the transfer), and the scheduling overhead (time spent in the interpreter outside
compute and communication; on an accelerator "compute" there is the time to queue the kernels).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch

from vpp.parallel.comm import irecv, isend
from vpp.parallel.groups import ParallelGroups
from vpp.transformer.attention.context_parallel import Split

from vpp.schedules.ir import COMPUTE, HANDOFF, RECV, SEND, Action, Plan
from vpp.schedules.trace import Span, Trace

from .device_order import RUN_AHEAD_COMPUTES, stream_ops_for
from .finite import FiniteWatch
from .handshake import RankInfo
from .sends import SendQueue
from .timing import ComputeTimer
from .watchdog import ExecutionError, Watchdog, WorkWatch, polls_completion


@dataclass
class ExecutionResult:
    """What one rank got out of a run: last-token logits per request (on the rank holding the last
    stage, else empty), this rank's spans, and interpreter overhead."""

    logits: dict[int, torch.Tensor]
    spans: list[Span]
    overhead_s: float
    num_actions: int
    meta: dict = field(default_factory=dict)
    nonfinite: list = field(default_factory=list)  # (stage, request) whose output held NaN/Inf here
    origin: float = 0.0  # time.perf_counter() at this rank's t0: its spans count from here

    def trace(self, num_ranks: int) -> Trace:
        return Trace(num_ranks, tuple(self.spans), dict(self.meta))


class Executor:
    """Interprets ``plan`` on this rank. ``stages`` maps stage id -> module for every stage the layout
    puts on this pipeline rank; ``infos`` are the handshake descriptors of this rank's pipeline
    (indexed by pipeline rank), used for receive-buffer shapes. ``timed``: time computes on the device
    (events, one synchronisation after the run) rather than by the host clock; it only matters on
    accelerators, where host-clock spans are the time to queue the kernels. ``device_ops``: the
    device primitives of the stream-ordered path (default: :func:`~.device_order.stream_ops_for` the
    pipeline's group, None on gloo; an emulated device passes its own)."""

    def __init__(self, plan: Plan, stages: Mapping[int, torch.nn.Module], groups: ParallelGroups,
                 pipeline: Sequence[RankInfo], *, run_key: str, timeout_s: float = 300.0,
                 poll_s: float = 0.05, progress: Callable[[int], None] | None = None, timed: bool = True,
                 extra_tokens: int = 0, device_ops=None):
        self.plan, self.stages, self.groups = plan, dict(stages), groups
        self.extra_tokens = extra_tokens  # cache room past each prompt (tokens the caller will decode)
        self.me = groups.pp.rank
        self.cp = groups.cp  # a group of one without context parallelism
        self.requests = {q.id: q for q in plan.requests}
        self.hidden = {}
        for info in pipeline:
            for st in info.stages:
                self.hidden[plan.layout.stage_of_layer(st.layer_range[0])] = (st.hidden_size, st.dtype)
        # the pipeline's process group says how its transfers can be waited for (NCCL/HCCL: polled)
        self.pollable = polls_completion(groups.pp.pg)
        self.ops = device_ops if device_ops is not None else stream_ops_for(groups)
        self.watchdog = Watchdog(run_key, self.me, timeout_s=timeout_s, poll_s=poll_s, pollable=self.pollable,
                                 global_ranks=groups.pp.ranks, store=getattr(self.ops, "store", None))
        self.device = groups.device
        self.timed = timed
        self.progress = progress  # called with the number of chunks through stage 0 so far
        layout = plan.layout
        self.gates_remote = plan.concurrency is not None and layout.rank_of(0) != layout.rank_of(layout.last_stage)

    # --- the interpreter loop ---------------------------------------------------------------------

    def run(self, prompts: Mapping[int, torch.Tensor] | None) -> ExecutionResult:
        # token ids move to this rank's device once; chunks are then slices (no copy per chunk)
        self.prompts = {q: ids.to(self.device) for q, ids in (prompts or {}).items()}
        self.ready: dict[tuple, torch.Tensor] = {}  # activation (producer stage, request, chunk) -> tensor
        self.pending: dict[tuple, tuple] = {}  # posted async receive: key -> (work, peer, action)
        self.deferred: dict[tuple, deque] = {}  # lane -> receives not posted yet (their request has not arrived)
        self.late: dict[tuple, tuple] = {}  # key of a deferred receive -> its lane
        self.sends = SendQueue(self.watchdog, pollable=self.pollable or self.ops is not None)  # held while in flight
        self.watch = WorkWatch(self.watchdog, select_device=getattr(self.ops, "select_device", None)) \
            if self.ops is not None else None
        self.marks: deque = deque()  # device path: an event after each queued compute (run-ahead bound)
        self.logits: dict[int, torch.Tensor] = {}
        self.spans: list[Span] = []
        self.entered = 0
        self.finite = FiniteWatch()
        busy = 0.0
        actions = self.plan.actions[self.me]
        acc = self.groups.accelerator
        # trace-only: device events, resolved with one synchronisation after the run (none per chunk)
        events = acc.event if self.timed and acc.kind != "cpu" else None
        if events is not None:
            acc.synchronize(self.device)  # t0 after the device is idle: host and device spans share it
        self.t0 = time.perf_counter()
        self.timer = ComputeTimer(self.me, self.t0, events=events,
                                  synchronize=(lambda: acc.synchronize(self.device)) if events else None)
        step, action = 0, None
        try:
            fuse = getattr(self.ops, "fuses", False)
            with torch.inference_mode():
                skip = 0
                for step, action in enumerate(actions):
                    if skip:
                        skip -= 1
                        continue
                    if self.watch is not None:
                        self.watch.check()
                    if fuse and action.op in (SEND, RECV):
                        spent, used = self._post_step(actions, step)
                        busy, skip = busy + spent, used - 1
                    else:
                        busy += self._do(action)
                    self.sends.sweep()
                busy += self._finish_sends() if self.ops is None else self._finish_device()
        except ExecutionError as exc:
            self.watchdog.notify_failure(self._where(step, action, "stopped"), exc.global_rank)
            self._abort()
            raise
        except Exception as exc:
            culprit, earlier = self.watchdog.failure()
            if earlier is not None and culprit != self.groups.global_rank:
                # another rank failed first and this one's error follows from it (a transfer to a peer
                # that closed its connections raises at once, before any wait reads the notice): name it
                self._abort()
                raise ExecutionError(f"{self._where(step, action, 'stopped')} because {earlier}", rank=self.me,
                                     action=str(action), global_rank=culprit) from exc
            notice = self._where(step, action, f"raised {type(exc).__name__}: {exc}")
            self.watchdog.notify_failure(notice, self.groups.global_rank)
            self._abort()
            raise ExecutionError(notice, rank=self.me, action=str(action), global_rank=self.groups.global_rank) from exc
        finally:
            self.sends.close()
            if self.watch is not None:
                self.watch.close()
            self.watchdog.close()
        total = time.perf_counter() - self.t0
        spans = sorted(self.timer.finish() + self.spans, key=lambda sp: sp.start)
        return ExecutionResult(self.logits, spans, max(0.0, total - busy), len(actions),
                               {"source": "executed", "plan": self.plan.name, "comm": self.plan.comm,
                                "timing": "host" if acc.kind == "cpu" else self.timer.mode if events else "host-dispatch",
                                "max_live_sends": self.sends.max_live}, self.finite.local(), self.t0)

    def _abort(self) -> None:
        """The device path after a fault: abort the communicators (NCCL/HCCL kernels waiting for a peer
        that will never come would spin until the process group's own timeout kills the process)."""
        abort = getattr(self.ops, "abort", None)
        if abort is not None:
            abort()

    def _where(self, step: int, action: Action | None, what: str) -> str:
        return f"pipeline rank {self.me} (global rank {self.groups.global_rank}) {what} at step {step} ({action})"

    def _now(self) -> float:
        return time.perf_counter() - self.t0

    def _do(self, a: Action) -> float:
        """Run one action; returns the seconds it spent computing or blocked (not overhead)."""
        if a.op == COMPUTE:
            return self._compute(a)
        if a.op == SEND:
            return self._send(a)
        if a.op == RECV:
            return self._recv(a)
        if a.op == HANDOFF:
            for q, c in self.plan.step_pieces(a.request, a.chunk):
                if (a.stage, q, c) not in self.ready:
                    raise RuntimeError(f"hand-off of {(a.stage, q, c)} before it was produced")
            return 0.0
        raise ValueError(f"unknown action {a}")

    # --- actions ----------------------------------------------------------------------------------

    def _admit(self, a: Action) -> float:
        """Hold back the first chunk of a request until it arrived and its admission gate opened."""
        q = self.requests[a.request]
        start = self._now()
        gate = self.plan.admission_gate(q.id)
        last_rank = self.plan.layout.rank_of(self.plan.layout.last_stage)
        if gate is not None and last_rank != self.me:
            self.watchdog.wait_done(gate.id, str(a), last_rank)
        delay = q.arrival - self._now()
        if delay > 0:
            time.sleep(delay)
        end = self._now()
        if end > start:
            self.spans.append(Span(self.me, "wait", start, end, a.stage, a.request, a.chunk))
        return end - start

    def _compute(self, a: Action) -> float:
        blocked = 0.0
        if a.stage == 0 and a.chunk == 0:
            blocked += self._admit(a)
        if a.stage == 0:
            q = self.requests[a.request]
            offset = q.offset(a.chunk)
            x = self.prompts[a.request][offset: offset + q.tokens(a.chunk)].to(self.device)
        else:
            src = (a.stage - 1, a.request, a.chunk)
            lead = (a.stage - 1, *self.plan.lead(a.request, a.chunk))
            if lead in self.late:
                blocked += self._post_late(lead)
            if lead in self.pending:
                blocked += self._wait_recv(lead) if self.ops is None else self._order_after_recv(lead)
            if lead == src and len(self.plan.step_pieces(a.request, a.chunk)) > 1 and \
                    not self.plan.layout.is_local_hop(a.stage - 1):
                self._split_step(lead)
            x = self.ready.pop(src)
        stage = self.stages[a.stage]
        q = self.requests[a.request]
        last = a.stage == self.plan.layout.last_stage
        if a.chunk == 0:
            reserve = getattr(stage, "reserve", None)  # optional in the stage contract
            if reserve is not None:
                reserve(a.request, q.length + self.extra_tokens)  # caches sized once for the whole request
        start = self._now()
        mark = self.timer.begin()
        kw = {"last_token_only": True} if last else {}
        if self.cp.size > 1 and a.stage > 0:  # this CP rank's rows of the chunk: the stage needs its size
            kw["chunk_tokens"] = q.tokens(a.chunk)
        out = stage(x, a.request, q.offset(a.chunk), **kw)
        self.timer.end(mark, a.stage, a.request, a.chunk)
        self.finite.observe(a.stage, a.request, out)  # a device-side flag: no synchronisation here
        if self.ops is not None:
            self._bound_run_ahead()
        end = self._now()
        if self.progress is not None:
            if a.stage == 0:
                self.entered += 1
                self.progress(self.entered)
            computed = getattr(self.progress, "computed", None)  # optional: every compute of this rank
            if computed is not None:
                computed(a.stage, a.request, a.chunk, end - start)
        if last:
            if a.chunk == q.num_chunks - 1:
                self.logits[a.request] = out[-1]
                if self.gates_remote:
                    self.watchdog.mark_done(a.request)
        else:
            self.ready[a.key] = out
        return blocked + (end - start)

    def rows(self, request: int, chunk: int) -> int:
        """Rows of (request, chunk) this rank's stages take and send: the chunk's tokens, or under
        context parallelism this CP rank's share of them (see the module docstring)."""
        tokens = self.requests[request].tokens(chunk)
        return tokens if self.cp.size == 1 else Split(tokens, self.cp.size).count(self.cp.rank)

    def step_rows(self, request: int, chunk: int) -> int:
        """Rows of the step led by (request, chunk): what its one transfer carries from this rank."""
        return sum(self.rows(q, c) for q, c in self.plan.step_pieces(request, chunk))

    def _split_step(self, lead: tuple) -> None:
        """One received step -> the inputs of its pieces, in step order (views of the buffer)."""
        stage, buf = lead[0], self.ready.pop(lead)
        pieces = self.plan.step_pieces(lead[1], lead[2])
        parts = torch.split(buf, [self.rows(q, c) for q, c in pieces])
        for (q, c), part in zip(pieces, parts):
            self.ready[(stage, q, c)] = part

    def _send(self, a: Action) -> float:
        x, channel = self._prepare_send(a)
        start = self._now()
        if self.ops is not None:
            return self._post_device(self.ops.isend(x, a.peer, channel), a, x, start)
        work = self.watchdog.post(lambda: isend(x, a.peer, channel), str(a), a.peer)
        if self.plan.comm == "blocking":
            self.watchdog.wait(work, str(a), a.peer)
            end = self._now()
            self.spans.append(Span(self.me, "send", start, end, *a.key, peer=a.peer))
            return end - start
        # posting is not free: gloo may write the data out in this thread when the peer is ready
        end = self._now()
        self.spans.append(Span(self.me, "send", start, end, *a.key, peer=a.peer))
        self.sends.post(work, x, a)
        return end - start

    def _prepare_send(self, a: Action):
        """The message of a SEND (one tensor per step) and its channel, checked against the receiver."""
        pieces = self.plan.step_pieces(a.request, a.chunk)
        outs = [self.ready.pop((a.stage, q, c)) for q, c in pieces]
        x = outs[0] if len(outs) == 1 else torch.cat(outs)  # one message per step
        hidden, dtype = self.hidden[a.stage]
        expected = (self.step_rows(a.request, a.chunk), hidden)
        if tuple(x.shape) != expected or str(x.dtype) != dtype:
            raise ValueError(f"stage {a.stage} produced {tuple(x.shape)} {x.dtype} for request {a.request} "
                             f"chunk {a.chunk}, but its receiver expects {expected} {dtype}")
        return x, self.groups.pp_channel(self.me, a.peer)

    def _post_step(self, actions, i: int) -> tuple[float, int]:
        """Where a process group runs its transfers on one stream (:attr:`.device_order.StreamOps.fuses`):
        the run of SEND/RECV actions at ``i`` (a step's transfers) posted as one batch per channel, so
        they run together instead of one after the other. Returns (seconds, actions consumed)."""
        j = i
        while j < len(actions) and actions[j].op in (SEND, RECV):
            j += 1
        if j - i == 1 or self.plan.comm == "blocking":
            return self._do(actions[i]), 1
        spent, batches = 0.0, {}
        for a in actions[i:j]:
            if a.op == RECV and (self.deferred.get((id(self.groups.pp_channel(a.peer, self.me)), a.peer))
                                 or self._arrival(a) > self._now()):
                spent += self._recv(a)  # deferred until its request arrives
                continue
            if a.op == SEND:
                x, channel = self._prepare_send(a)
            else:
                hidden, dtype = self.hidden[a.stage]
                x = torch.empty(self.step_rows(a.request, a.chunk), hidden,
                                dtype=getattr(torch, dtype.replace("torch.", "")), device=self.device)
                channel = self.groups.pp_channel(a.peer, self.me)
                self.ready[a.key] = x
            batches.setdefault(id(channel), (channel, []))[1].append((a, x))
        for channel, items in batches.values():
            start = self._now()
            works = self.ops.batch([("send" if a.op == SEND else "recv", x, a.peer) for a, x in items], channel)
            for (a, x), work in zip(items, works):
                spent += self._post_device(work, a, x if a.op == SEND else None, start)
        return spent, j - i

    def _recv(self, a: Action) -> float:
        hidden, dtype = self.hidden[a.stage]
        buf = torch.empty(self.step_rows(a.request, a.chunk), hidden, dtype=getattr(torch, dtype.replace("torch.", "")), device=self.device)
        channel = self.groups.pp_channel(a.peer, self.me)
        self.ready[a.key] = buf
        lane = (id(channel), a.peer)
        if self.plan.comm == "blocking":
            return self._sleep_until(self._arrival(a)) + self._post_recv(a, buf, channel)
        if self.deferred.get(lane) or self._arrival(a) > self._now():
            # the peer cannot send before the request arrives: posting now would start the receive's
            # deadline (and NCCL's own watchdog clock, which starts at enqueue) during an idle gap
            self.deferred.setdefault(lane, deque()).append((a, buf, channel))
            self.late[a.key] = lane
            return 0.0
        return self._post_recv(a, buf, channel)

    def _arrival(self, a: Action) -> float:
        """When the sender can first send ``a``'s step: its latest request's arrival (run clock)."""
        return max(self.requests[q].arrival for q, _ in self.plan.step_pieces(a.request, a.chunk))

    def _sleep_until(self, t: float) -> float:
        """Sleep until ``t`` on the run's clock, checking for faults; returns the seconds slept."""
        start = self._now()
        while (left := t - self._now()) > 0:
            if self.watch is not None:
                self.watch.check()
            self.watchdog._check("an idle gap before a request's arrival", None, float("inf"))
            time.sleep(min(left, self.watchdog.poll_s))
        return self._now() - start

    def _post_late(self, key: tuple) -> float:
        """Post the deferred receives of ``key``'s lane up to ``key`` (in order: a pair communicator
        matches its transfers in posting order), each once its request has arrived."""
        lane, slept = self.late[key], 0.0
        while self.deferred[lane]:
            a, buf, channel = self.deferred[lane].popleft()
            slept += self._sleep_until(self._arrival(a))
            del self.late[a.key]
            self._post_recv(a, buf, channel)
            if a.key == key:
                break
        return slept

    def _post_recv(self, a: Action, buf: torch.Tensor, channel) -> float:
        start = self._now()
        if self.ops is not None:
            return self._post_device(self.ops.irecv(buf, a.peer, channel), a, None, start)
        work = self.watchdog.post(lambda: irecv(buf, a.peer, channel), str(a), a.peer)
        if self.plan.comm == "blocking":
            self.watchdog.wait(work, str(a), a.peer)
            end = self._now()
            self.spans.append(Span(self.me, "recv", start, end, *a.key, peer=a.peer))
            return end - start
        end = self._now()
        self.spans.append(Span(self.me, "recv", start, end, *a.key, peer=a.peer))
        self.pending[a.key] = (work, a)
        return end - start

    def _wait_recv(self, key: tuple) -> float:
        work, a = self.pending.pop(key)
        start = self._now()
        self.watchdog.wait(work, str(a), a.peer)
        end = self._now()
        if end > start:
            self.spans.append(Span(self.me, "recv", start, end, *a.key, peer=a.peer))
        return end - start

    def _finish_sends(self) -> float:
        blocked = 0.0
        if self.late:
            raise RuntimeError(f"receives {sorted(self.late)} were planned but never consumed")
        for start, end, a in self.sends.finish(self._now):
            self.spans.append(Span(self.me, "send", start, end, *a.key, peer=a.peer))
            blocked += end - start
        if self.pending:
            raise RuntimeError(f"receives {sorted(self.pending)} were posted but never consumed")
        return blocked

    # --- the stream-ordered path (NCCL / HCCL, or an emulated device) --------------------------------

    def _post_device(self, work, a: Action, x: torch.Tensor | None, start: float) -> float:
        """A posted send (``x`` its buffer) or receive: watched by the watchdog thread; in blocking mode
        the current stream is ordered after it at once, in async mode a receive is ordered before its
        consumer (:meth:`_order_after_recv`). The host never waits here."""
        self.watch.watch(work, str(a), a.peer)
        if self.plan.comm == "blocking":
            self.ops.order_after(work)
        elif a.op == RECV:
            self.pending[a.key] = (work, a)
        if x is not None:
            self.sends.post(work, x, a)  # dropped by sweep() once its end event says done
        end = self._now()
        self.spans.append(Span(self.me, "send" if a.op == SEND else "recv", start, end, *a.key, peer=a.peer))
        return end - start

    def _order_after_recv(self, key: tuple) -> float:
        work, _ = self.pending.pop(key)
        self.ops.order_after(work)
        return 0.0

    def _bound_run_ahead(self) -> None:
        """Keep at most RUN_AHEAD_COMPUTES computes queued: wait (on the host) for an earlier compute's
        event, never for a transfer."""
        self.marks.append(self.ops.mark())
        while len(self.marks) > RUN_AHEAD_COMPUTES:
            event = self.marks.popleft()
            if not self.ops.is_done(event):
                self.ops.host_wait(event, self.watch.check)

    def _finish_device(self) -> float:
        """The plan's end: order the current stream after every send still in flight and wait once."""
        if self.pending or self.late:
            raise RuntimeError(f"receives {sorted(self.pending) + sorted(self.late)} were posted but never consumed")
        start = self._now()
        for work in self.sends.works():
            self.ops.order_after(work)
        self.ops.host_wait(self.ops.mark(), self.watch.check, end=True)
        self.sends.sweep()
        if self.sends.live:
            raise RuntimeError(f"{self.sends.live} sends still in flight after the end of the plan")
        end = self._now()
        return end - start


__all__ = ["ExecutionResult", "Executor"]
