"""vpp's CPU attention kernel (fp32, AVX-512): equal to an independent float64 softmax, routed to by
the kernel table, and falling back to torch's kernel (the reference path) wherever it cannot run."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from vpp.transformer.attention import cpu_kernel, kernel
from vpp.transformer import native

needs_kernel = pytest.mark.skipif(cpu_kernel.library() is None,
                                  reason=f"vpp's CPU attention kernel does not run here: "
                                         f"{cpu_kernel.unavailable_reason()}")


def reference(q, k, v, scale, offset):
    """float64 softmax over the keys j <= i + offset, grouped heads by repetition (independent of both kernels)."""
    hq, lq, _ = q.shape
    hk, lk, _ = k.shape
    g = hq // hk
    kk, vv = k.double().repeat_interleave(g, 0), v.double().repeat_interleave(g, 0)
    s = (q.double() @ kk.transpose(1, 2)) * scale
    seen = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + offset
    s = s.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.nan_to_num(torch.softmax(s, -1)) @ vv  # rows that see nothing: 0
    return out, lse


CASES = [  # hq, hk, lq, lk, d, dv, offset
    (8, 2, 1024, 3072, 64, 64, 2048),   # a chunk after a prefix, grouped heads (the Qwen3 shape)
    (8, 2, 100, 1400, 64, 64, 1300),    # several key blocks, rows not a multiple of the tiles
    (4, 4, 37, 37, 128, 64, 0),         # a square causal piece, MLA widths (q/k 128, v 64)
    (8, 8, 70, 700, 192, 128, 700),     # every key (a prefix piece), DeepSeek-V3's widths
    (2, 1, 1, 777, 64, 64, 776),        # one query (a decode step)
    (6, 3, 131, 131, 80, 48, 0),        # odd widths: d not a multiple of 16, dv of 16 but not 64
    (2, 2, 9, 20, 16, 16, -3),          # a negative offset: the first 3 rows see no key
]


@needs_kernel
@pytest.mark.parametrize("hq,hk,lq,lk,d,dv,offset", CASES)
def test_the_kernel_equals_an_independent_softmax(hq, hk, lq, lk, d, dv, offset):
    gen = torch.Generator().manual_seed(lq * 7 + lk)
    q = torch.randn(lq, hq, d, generator=gen).transpose(0, 1)  # a strided view, as the layers pass it
    k, v = torch.randn(hk, lk, d, generator=gen) * 2, torch.randn(hk, lk, dv, generator=gen)
    scale = d ** -0.5
    out, lse = cpu_kernel.attention(q, k, v, scale, offset)
    want, want_lse = reference(q, k, v, scale, offset)
    assert out.shape == (hq, lq, dv) and lse.shape == (hq, lq)
    assert float((out.double() - want).abs().max()) <= 1e-5 * float(want.abs().max())
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert float((lse.double() - want_lse)[finite].abs().max()) <= 1e-5
    if offset < 0:
        assert float(out[:, :-offset].abs().max()) == 0.0


@needs_kernel
def test_threads_split_the_work_without_changing_a_bit():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(h, n, 64, generator=gen) for h, n in ((8, 300), (2, 1500), (2, 1500)))
    one = cpu_kernel.attention(q, k, v, 0.125, 1200, threads=1)
    three = cpu_kernel.attention(q, k, v, 0.125, 1200, threads=3)
    assert torch.equal(one[0], three[0]) and torch.equal(one[1], three[1])


@needs_kernel
def test_the_kernel_table_routes_fp32_cpu_attention_to_it(monkeypatch):
    calls = []
    real = cpu_kernel.attention
    monkeypatch.setattr(cpu_kernel, "attention", lambda *a, **kw: calls.append(a[4]) or real(*a, **kw))
    gen = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(8, 40, 64, generator=gen), torch.randn(2, 100, 64, generator=gen), torch.randn(2, 100, 64, generator=gen)
    out = kernel.causal_attention(q, k, v, 0.125)
    kernel.attention_lse(q, k, v, 0.125)
    kernel.attention_lse(q[:, :40], k[:, :40], v[:, :40], 0.125, causal=True)
    assert calls == [60, 100, 0]  # bottom-right causal, every key, square causal
    monkeypatch.setenv("VPP_CPU_ATTENTION", "torch")  # the reference path: torch's kernel, same answer
    ref = kernel.causal_attention(q, k, v, 0.125)
    assert len(calls) == 3
    assert float((out - ref).abs().max()) <= 1e-5 * float(ref.abs().max())
    monkeypatch.delenv("VPP_CPU_ATTENTION")
    kernel.causal_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.125)  # not fp32: torch's kernel
    kernel.causal_attention(q, k, v[..., :40], 0.125)  # value width not a multiple of 16: torch's kernel
    kernel.causal_attention(q[:, -1:], k, v, 0.125)  # a decode step: 4 rows per key head, torch's kernel
    assert len(calls) == 3
    assert 4 * 16 == cpu_kernel.MIN_ROWS  # 16 queries of 4 grouped heads: the kernel
    kernel.causal_attention(q[:, -16:], k, v, 0.125)
    assert calls[-1] == 84


@needs_kernel
def test_outputs_are_made_on_the_cpu_under_a_default_device():
    """Under ``with torch.device("meta")`` a bare ``torch.empty`` lands on meta: the kernel would write
    through a null pointer. Its buffers name their device."""
    q, k, v = torch.randn(2, 10, 64), torch.randn(2, 30, 64), torch.randn(2, 30, 64)
    want = cpu_kernel.attention(q, k, v, 0.125, 20)[0]
    with torch.device("meta"):
        got = cpu_kernel.attention(q, k, v, 0.125, 20)[0]
    assert got.device.type == "cpu" and torch.equal(got, want)


def test_a_mode_that_is_not_one_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("VPP_CPU_ATTENTION", "fast")
    with pytest.raises(ValueError, match="VPP_CPU_ATTENTION='fast' is not one of"):
        cpu_kernel.supports(torch.zeros(1, 1, 16), torch.zeros(1, 1, 16), torch.zeros(1, 1, 16))


def test_an_unusable_kernel_falls_back_to_torch_or_fails_when_required(monkeypatch, caplog):
    monkeypatch.setattr(cpu_kernel, "_state", {"lib": None, "why": "no compiler (test)"})
    q, k, v = torch.randn(2, 70, 16), torch.randn(2, 90, 16), torch.randn(2, 90, 16)
    monkeypatch.setenv("VPP_CPU_ATTENTION", "auto")
    out = kernel.causal_attention(q, k, v, 0.25)  # torch's kernel
    want = reference(q, k, v, 0.25, 20)[0]
    assert float((out.double() - want).abs().max()) <= 1e-5
    monkeypatch.setenv("VPP_CPU_ATTENTION", "vpp")
    with pytest.raises(RuntimeError, match="VPP_CPU_ATTENTION=vpp but .* no compiler \\(test\\)"):
        kernel.causal_attention(q, k, v, 0.25)


@pytest.mark.slow  # runs the compiler
def test_the_build_is_cached_and_a_failed_build_says_why(tmp_path):
    if cpu_kernel._compiler() is None:
        pytest.skip("no C++ compiler here")
    first = cpu_kernel.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert cpu_kernel.build(tmp_path) == first and first.stat().st_mtime_ns == stamp  # found, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary file left
    broken = tmp_path / "cxx"
    broken.write_text("#!/bin/sh\necho 'fatal error: out of cheese' >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(RuntimeError, match="cxx exited with 3 building attn_avx512.cpp: fatal error: out of cheese"):
        cpu_kernel.build(tmp_path / "other", compiler=str(broken))
    assert list((tmp_path / "other").iterdir()) == []


@pytest.mark.slow  # runs the compiler in two processes
def test_ranks_building_at_once_each_load_a_whole_library(tmp_path):
    """Two processes compile into one empty cache directory at the same moment: the rename is atomic,
    so both end with the same complete library (each loads it)."""
    if cpu_kernel._compiler() is None:
        pytest.skip("no C++ compiler here")
    code = ("import ctypes, sys; from vpp.transformer.attention import cpu_kernel; "
            "p = cpu_kernel.build(sys.argv[1]); ctypes.CDLL(str(p)).vpp_attn_abi(); print(p)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    procs = [subprocess.Popen(["python", "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    paths = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1 and [p.name for p in tmp_path.iterdir()] == [os.path.basename(paths.pop())]


@needs_kernel
def test_a_nan_reaches_the_output_as_in_torch_s_kernel(monkeypatch):
    """A NaN in a query or a key must come out as NaN (the stage's finite check names the layer), not
    vanish in the softmax's clamp or maximum."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = torch.randn(8, 40, 64, generator=gen), torch.randn(2, 700, 64, generator=gen), torch.randn(2, 700, 64, generator=gen)
    q[3, 7, 5] = float("nan")  # one query row of head 3
    k[1, 650, 0] = float("nan")  # a key of key head 1 that every row sees (650 <= i + 660)
    out = cpu_kernel.attention(q, k, v, 0.125, 660)[0]
    monkeypatch.setenv("VPP_CPU_ATTENTION", "torch")
    want = kernel.causal_attention(q, k, v, 0.125)
    assert torch.equal(out.isnan().any(-1), want.isnan().any(-1))
    assert out[3, 7].isnan().all() and out[4:].isnan().all() and not out[:3].isnan().any()


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VPP_CACHE_DIR", str(tmp_path / "explicit"))
    assert cpu_kernel.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("VPP_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cpu_kernel.cache_dir() == tmp_path / "xdg" / "vpp"


def test_a_machine_that_cannot_build_says_why_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(native.platform, "machine", lambda: "aarch64")
    with pytest.raises(RuntimeError, match="x86-64 AVX-512 code; this machine is aarch64"):
        cpu_kernel.build(tmp_path)
    monkeypatch.setattr(native.platform, "machine", lambda: "x86_64")
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"no C\+\+ compiler"):
        cpu_kernel.build(tmp_path)


@pytest.mark.parametrize("abi,cpu_ok,why", [(1, 1, "unexpected ABI 1"), (2, 0, "this CPU has no AVX-512 F/DQ")])
def test_a_library_that_cannot_run_here_is_not_used(monkeypatch, abi, cpu_ok, why):
    class Fake:
        def vpp_attn_abi(self):
            return abi

        def vpp_attn_cpu_ok(self):
            return cpu_ok
    monkeypatch.setattr(cpu_kernel, "build", lambda: "/nowhere/libvpp_attn.so")
    monkeypatch.setattr(cpu_kernel.ctypes, "CDLL", lambda path: Fake())
    monkeypatch.setattr(cpu_kernel, "_state", {})
    warned = []  # the logger itself (other tests may configure vpp's loggers not to propagate)
    monkeypatch.setattr(native.log, "warning", lambda msg, *args: warned.append(msg % args))
    assert cpu_kernel.library() is None
    assert cpu_kernel.unavailable_reason() == (f"{cpu_kernel.SOURCE.name}: {why}" if abi != 2 else why)
    assert len(warned) == 1 and why in warned[0] and "torch's CPU flash kernel runs instead" in warned[0]


@needs_kernel
def test_arguments_the_kernel_cannot_take_are_refused_by_name():
    q, k, v = torch.randn(2, 8, 16), torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    with pytest.raises(ValueError, match=r"k \(2, 8, 32\) does not match q \(2, 8, 16\)"):
        cpu_kernel.attention(q, torch.randn(2, 8, 32), v, 0.25, 0)
    with pytest.raises(ValueError, match="takes CPU tensors, got meta"):
        cpu_kernel.attention(q.to("meta"), k.to("meta"), v.to("meta"), 0.25, 0)
    with pytest.raises(ValueError, match=r"vpp_attn_f32 refused .* v \(2, 8, 8\) \(-1\)"):  # a value width of 8
        cpu_kernel.attention(q, k, torch.randn(2, 8, 8), 0.25, 0)


@needs_kernel
def test_the_output_written_positions_major_is_the_same_attention():
    """``position_major=True`` writes [Lq, Hq, Dv] in memory (what the layers transpose to next): the same
    numbers, bitwise, and the transposed view needs no copy."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(8, 150, 64, generator=gen), torch.randn(2, 400, 64, generator=gen), torch.randn(2, 400, 64, generator=gen)
    out, lse = cpu_kernel.attention(q, k, v, 0.125, 250)
    pos, lse2 = cpu_kernel.attention(q, k, v, 0.125, 250, position_major=True)
    assert torch.equal(out, pos) and torch.equal(lse, lse2)
    assert pos.transpose(0, 1).is_contiguous() and out.is_contiguous()
    assert float((out.double() - reference(q, k, v, 0.125, 250)[0]).abs().max()) <= 1e-5
