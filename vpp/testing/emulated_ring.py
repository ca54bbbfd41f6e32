"""Context parallelism's ring on the emulated device (:mod:`.emulated_device`): ``cp`` threads, each a CP
rank running the real :func:`~vpp.transformer.attention.context_parallel.cp_attention` (real tensors,
real arithmetic) over a sharded cache, chunk after chunk and layer after layer, with the device's
transfers in place of NCCL's. The emulation enforces NCCL's rules (a block read before its receive is
ordered before it raises; a pair communicator's first use blocks the host) and keeps a virtual timeline:

* a block attention (one ``attend`` call) takes ``4 Hq m n D`` FLOPs (half where causal) at the device's
  attention rate (``peak_flops x eff_attn``), a transfer of ``b`` bytes takes ``cp_p2p(b)`` on the
  ring's link (:meth:`~vpp.perf.hardware.Device.ring_bw`);
* ``scale`` virtual tokens stand for each real row (FLOPs grow as its square, bytes linearly), so that
  small tensors can stand for the chunk sizes where a ring is used (thousands of tokens per rank).

:func:`emulate_ring` returns the makespan, the receive overlap (the share of the receives' transfer
time during which the receiving rank's compute stream was busy: 1.0 when every transfer hides behind
an attention), the host's blocking waits on transfers, and the largest difference from the unsplit
causal attention.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from vpp.parallel.groups import Group
from vpp.perf.hardware import Device, get_device
from vpp.transformer.attention.context_parallel import CPChunk, Split, cp_attention
from vpp.transformer.attention.kernel import attention_lse, causal_attention

from .emulated_device import EmulatedDevice, EmulationError


@dataclass(frozen=True)
class RingCost:
    """Virtual seconds of the ring's work on ``device`` (see the module docstring)."""

    device: Device
    cp: int
    scale: int = 1

    def attention(self, flops: float) -> float:
        return flops * self.scale ** 2 / (self.device.peak_flops * self.device.eff_attn)

    def transfer(self, nbytes: int) -> float:  # the emulated device's transfer time of a packed buffer
        return self.device.cp_p2p(float(nbytes) * self.scale, self.device.ring_bw(self.cp))


class _Filled:
    """A transfer's work whose ``wait()`` also waits, in wall time, until the peer has posted its end:
    the emulation's attention runs on the host at once, so the received bytes must be there (the
    virtual timeline is untouched: only the ordering of the device's streams counts there)."""

    def __init__(self, device: EmulatedDevice, work):
        self.device, self.work, self.op = device, work, work.op

    def wait(self) -> bool:
        with self.device.cond:
            if not self.device.cond.wait_for(lambda: self.op.peer_op is not None or self.op.error is not None,
                                             self.device.timeout_s):
                raise EmulationError(f"{self.op.label}: the peer never posted its end")
        return self.work.wait()


@dataclass
class RingEmulation:
    makespan_s: float
    recv_overlap: float          # every receive of every chunk
    recv_overlap_steady: float   # receives of the chunks after the first (every rank holds a prefix)
    host_transfer_waits: list[int]
    max_abs_error: float
    receives: int


def emulate_ring(cp: int = 2, chunks=(64, 64, 64, 64), *, layers: int = 2, heads: int = 8, kv_heads: int = 2,
                 head_dim: int = 32, method: str = "pass-kv", device: Device | str = "h100", scale: int = 128,
                 host_waits: bool = False, streams: str = "pair", seed: int = 0, timeout_s: float = 60.0) -> RingEmulation:
    """Run ``len(chunks)`` chunks of ``layers`` CP attention layers on ``cp`` emulated ranks (see the
    module docstring). ``host_waits``: the host waits for every transfer before going on (the path that
    hides nothing; exists to show that the measures catch it)."""
    if method != "pass-kv":
        raise ValueError(f"method={method!r}: the emulated ring runs pass-kv (pass-q's partials return by an "
                         f"all-to-all and all-gather is a collective, neither of which it models)")
    dev = get_device(device) if isinstance(device, str) else device
    cost = RingCost(dev, cp, scale)
    emu = EmulatedDevice(cp, cost, timeout_s=timeout_s, streams=streams)
    total = sum(chunks)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(layers, h, total, head_dim, generator=g) for h in (heads, kv_heads, kv_heads))
    softmax_scale = head_dim ** -0.5
    ref = [causal_attention(q[i], k[i], v[i], softmax_scale) for i in range(layers)]
    errors = [0.0] * cp
    failures: dict[int, BaseException] = {}
    barrier = threading.Barrier(cp, timeout=timeout_s)

    def rank_main(r: int) -> None:
        started = False
        try:
            emu.select_device(r, host=True)
            group = Group(tuple(range(cp)), r)
            label = {"now": ""}

            def exchange(sends, recvs, _group):
                items = [("recv", buf, peer, "cp", f"{label['now']} recv {r}<{peer}") for buf, peer in recvs]
                items += [("send", x, peer, "cp", f"{label['now']} send {r}>{peer}") for x, peer in sends]
                works = [_Filled(emu, w) for w in emu.post_batch(r, items)]
                if host_waits:
                    for w in works:
                        emu.host_wait(r, w.op, lambda: None, "host_transfer_waits")
                return works

            def attend(qs, rows, causal):
                m, n = qs.shape[1], rows["k"].shape[1]
                flops = 4.0 * qs.shape[0] * m * n * head_dim * (0.5 if causal else 1.0)
                emu.compute(r, f"{label['now']} attend", cost.attention(flops), inputs=tuple(rows.values()))
                return attention_lse(qs, rows["k"], rows["v"], softmax_scale, causal=causal)

            # set the ring's pair communicators up one pair at a time, in one order on every rank (a
            # ring posting all its first transfers at once would wait in a cycle, as lazy NCCL would)
            for a, b in sorted({tuple(sorted((t, (t + 1) % cp))) for t in range(cp)}):
                if r in (a, b):
                    peer = b if r == a else a
                    for w in exchange([(torch.zeros(1), peer)], [(torch.empty(1), peer)], group):
                        w.wait()
            if barrier.wait() == 0:
                emu.start_epoch()
            barrier.wait()
            started = True
            positions = torch.zeros(0, dtype=torch.long)
            prefix_rows = [0] * cp
            shares = [torch.zeros(0, dtype=torch.long) for _ in range(cp)]
            offset = 0
            for c, tokens in enumerate(chunks):
                split = Split(tokens, cp)
                shares = [torch.cat((s, offset + split.index(t))) for t, s in enumerate(shares)]
                mine = offset + split.index(r)
                positions = shares[r]
                info = CPChunk(group, split, offset, tuple(prefix_rows), tuple(shares), method, exchange)
                for layer in range(layers):
                    label["now"] = f"c{c}.l{layer}"
                    kv = {"k": k[layer][:, positions], "v": v[layer][:, positions]}
                    out = cp_attention(attend, q[layer][:, mine], kv, {"k": 1, "v": 1}, info, head_dim)
                    errors[r] = max(errors[r], float((out - ref[layer][:, mine]).abs().max()) if len(mine) else 0.0)
                prefix_rows = [len(s) for s in shares]
                offset += tokens
        except BaseException as exc:  # reported on the caller's thread
            failures[r] = exc
            if not started:  # after the start an abort would only break a rank still waking from it
                barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"emulated-cp-{r}", daemon=True) for r in range(cp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 5)
    if any(t.is_alive() for t in threads):
        raise EmulationError(f"emulated CP ranks still running after {timeout_s:g}s")
    if failures:
        first = min(failures, key=lambda r: (isinstance(failures[r], threading.BrokenBarrierError), r))
        raise EmulationError("; ".join(f"emulated CP rank {r} failed: {type(e).__name__}: {e}"
                                       for r, e in sorted(failures.items()))) from failures[first]
    receives = sum(op.kind == "recv" and op.duration > 0 for op in emu.ops)
    steady = emu.recv_overlap(steady=False, keep=lambda label: not label.startswith("c0."))
    return RingEmulation(emu.makespan(), emu.recv_overlap(steady=False), steady,
                         [c.host_transfer_waits for c in emu.counters], max(errors), receives)


__all__ = ["RingCost", "RingEmulation", "emulate_ring"]
