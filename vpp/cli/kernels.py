"""``vpp kernels``: which kernel runs each op of a layer on this machine's CPU, and why.

    vpp kernels [--dtype float32|bfloat16]

One line per op: vpp's own C++ CPU kernels where they run (fp32 on AVX-512, built at first use into
the cache directory), else torch's, with the reason (the CPU, the compiler, the dtype, or the
``VPP_CPU_ATTENTION`` / ``VPP_CPU_OPS`` switch); then what a CPU rank does with the host memory it
frees (``VPP_HOST_MALLOC``) and the accelerator torch sees. The choices are the library's own
(:mod:`vpp.transformer.attention.cpu_kernel`, :mod:`vpp.transformer.cpu_ops`): this asks them with
small tensors of the dtype and prints their answers.
"""

from __future__ import annotations

from vpp.cli.args import UsageError


def add_arguments(parser) -> None:
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the dtype the ops are asked about (the models' CPU default is float32)")


def check(args) -> None:
    from vpp.parallel import host_memory
    from vpp.transformer import native
    try:
        for env in ("VPP_CPU_ATTENTION", "VPP_CPU_OPS"):
            native.mode(env)
        host_memory.mode()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _why_not(library_reason: str | None, env: str, dtype) -> str:
    import torch

    from vpp.transformer import native
    if native.mode(env) == "torch":
        return f"{env}=torch"
    if dtype != torch.float32:
        return "vpp's kernels are float32 only"
    return library_reason or "its arguments"


def rows(dtype_name: str) -> list[tuple[str, str]]:
    """(op, what runs here and why) for every op :func:`run` prints."""
    import torch

    from vpp.parallel import host_memory
    from vpp.parallel.device import npu_available
    from vpp.transformer import cpu_ops
    from vpp.transformer.attention import cpu_kernel

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=gen).to(dtype)
    q, kv = torch.randn(8, 64, 64, generator=gen).to(dtype), torch.randn(2, 64, 64, generator=gen).to(dtype)
    gate_up, down = torch.randn(2, 64, 128, generator=gen).to(dtype), torch.randn(2, 128, 32, generator=gen).to(dtype)
    cos = torch.ones(64, 64, dtype=dtype)

    def answer(ask, yes: str, no: str, reason, env: str) -> str:
        try:
            runs = ask()
        except RuntimeError as exc:  # VPP_...=vpp where the kernel cannot run: the library's own error
            return f"error: {exc}"
        return yes if runs else f"{no} ({_why_not(reason(), env, dtype)})"

    attention = answer(lambda: cpu_kernel.supports(q, kv, kv), "vpp's CPU attention kernel (one pass, grouped heads)",
                       "torch's CPU flash kernel", cpu_kernel.unavailable_reason, cpu_kernel.ENV)
    experts = answer(lambda: cpu_ops.supports(x, gate_up, down, "silu"),
                     "vpp's fused MoE kernel (gather, GEMMs, SiLU x up, weighted scatter in one pass)",
                     "per-expert torch.mm in one pass over two buffers", cpu_ops.unavailable_reason, cpu_ops.ENV)
    norm = answer(lambda: cpu_ops.rms_norm(x, x[0], 1e-6) is not None, "vpp's one-pass RMSNorm",
                  "torch ops", cpu_ops.unavailable_reason, cpu_ops.ENV)
    rope = answer(lambda: cpu_ops.rotate_half(q.transpose(0, 1), cos, cos) is not None,
                  "vpp's one-pass half rotation", "torch ops", cpu_ops.unavailable_reason, cpu_ops.ENV)
    memory = ("kept for reuse (glibc mmap threshold 64 MiB, trim threshold 1 GiB; VPP_HOST_MALLOC=default opts out)"
              if host_memory.mode() == "keep" else "glibc's defaults (VPP_HOST_MALLOC=default)")
    device = ("npu (torch_npu's fused ops: README, 'Which kernel runs where')" if npu_available() else
              f"cuda, {torch.cuda.device_count()} device(s) (SDPA, grouped GEMM in bf16)" if torch.cuda.is_available()
              else "none: ranks run on the CPU over gloo")
    return [("attention (a chunk)", attention),
            ("attention (a decode step)", f"torch's CPU flash kernel (fewer than {cpu_kernel.MIN_ROWS} query rows "
                                          f"per key head)"),
            ("MoE experts (SiLU)", experts), ("RMSNorm", norm), ("RoPE, half rotation", rope),
            ("RoPE, interleaved pairs", "torch ops"),
            ("host memory of a CPU rank", memory), ("accelerator", device)]


def run(args) -> int:
    table = rows(args.dtype)
    width = max(len(op) for op, _ in table)
    print(f"vpp's kernels on this machine, {args.dtype} (cache: {_cache()})")
    for op, what in table:
        print(f"  {op:<{width}}  {what}")
    return 0


def _cache() -> str:
    from vpp.transformer import native
    return str(native.cache_dir())
