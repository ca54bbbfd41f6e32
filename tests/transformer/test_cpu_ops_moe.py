"""vpp's fused CPU MoE kernel (:mod:`vpp.transformer.cpu_ops`, fp32, AVX-512): equal to an independent
float64 per-pair loop over awkward shapes, bitwise the same for any thread count, a NaN reaching exactly
the rows it should, arguments it cannot take refused by name, and MoE routed to it (or not) by
``VPP_CPU_OPS``, with the same answer as the reference path.

Tolerance: 1e-5 of the largest reference value. The kernel sums in fp32 over H <= 100 and I <= 48 with
a polynomial exp (a few ulp), so its error is ~1e-6 of the output scale; a wrong expert, token, weight
or row is an O(1) error."""

from __future__ import annotations

import math

import pytest
import torch

from vpp.parallel import ParallelGroups
from vpp.transformer import cpu_ops
from vpp.transformer.moe import MoE, MoEConfig

needs_kernel = pytest.mark.skipif(cpu_ops.library() is None,
                                  reason=f"vpp's CPU MoE kernel does not run here (no AVX-512 F/DQ or no "
                                         f"compiler): {cpu_ops.unavailable_reason()}")

RB = 128  # pairs per work item in csrc/cpu_ops.cpp


def reference(x, tokens, weights, counts, local, gate_up, down, out=None):
    """float64, one pair at a time, written out: out[t] += w * down[e] (silu(G x_t) * U x_t)."""
    inter = gate_up.shape[1] // 2
    res = torch.zeros(x.shape, dtype=torch.float64) if out is None else out.double().clone()
    p = 0
    for e, n in zip(local, counts):
        g_w, u_w, d_w = gate_up[e, :inter].double(), gate_up[e, inter:].double(), down[e].double()
        for _ in range(n):
            t = int(tokens[p])
            xt = x[t].double()
            g, u = g_w @ xt, u_w @ xt
            res[t] += float(weights[p]) * (d_w @ (g / (1.0 + torch.exp(-g)) * u))
            p += 1
    return res


def routed_pairs(t_n, e_n, k, local, probs, gen):
    """Each token picks k distinct experts of e_n (``probs``: their odds, 0 = never picked); the pairs
    of the ``local`` experts, sorted by their place in ``local`` (stable: increasing token): (tokens,
    weights, counts)."""
    ids = torch.multinomial(torch.tensor(probs, dtype=torch.float64).expand(t_n, e_n), k, generator=gen)
    w = torch.rand(t_n, k, generator=gen) + 0.1
    pairs = [[] for _ in local]
    for t in range(t_n):
        for j in range(k):
            e = int(ids[t, j])
            if e in local:
                pairs[local.index(e)].append((t, float(w[t, j])))
    flat = [pair for seg in pairs for pair in seg]
    tokens = torch.tensor([t for t, _ in flat], dtype=torch.int64)
    weights = torch.tensor([v for _, v in flat], dtype=torch.float32)
    return tokens, weights, [len(seg) for seg in pairs]


def experts_weights(e_n, h, inter, gen, strided=False):
    """gate_up [E, 2I, H], down [E, H, I], O(1) activations; ``strided``: views whose rows are not
    adjacent (row stride past the row's end), as a slice of a wider tensor would be."""
    pad = 3 if strided else 0
    gate_up = (torch.randn(e_n, 2 * inter, h + pad, generator=gen) / math.sqrt(h))[..., :h]
    down = (torch.randn(e_n, h, inter + pad, generator=gen) / math.sqrt(inter))[..., :inter]
    return gate_up, down


CASES = {  # T, H, I, E, top_k, local, odds of each expert, extra
    # odd widths (neither a multiple of 16), expert 5 gets no pair
    "h100_i40_empty_expert": (80, 100, 40, 6, 2, [0, 1, 2, 3, 4, 5], [1, 1, 1, 1, 1, 0], {}),
    # one expert with ~360 pairs: three work items, the last one partial
    "top1_several_blocks": (400, 64, 32, 3, 1, [0, 1, 2], [10, 1, 0.1], {}),
    # top 4 of 8, the local experts a permutation, a non-zero out accumulated, strided weights and rows
    "top4_permuted_out": (50, 48, 24, 8, 4, [5, 2, 7, 0, 1, 3, 6, 4], [1] * 8, {"out": True, "strided": True}),
    # EP: this rank holds experts 2 and 3 of 5; the pairs of the others are not its own
    "ep_local_2_3_of_5": (60, 32, 16, 5, 2, [2, 3], [1] * 5, {"out": True}),
    # local experts in decreasing order, not adjacent; widths below one vector (scalar tails only)
    "tiny_widths": (30, 7, 5, 5, 2, [4, 1], [1] * 5, {}),
    # widths exactly one vector; 130 pairs of expert 0 (a block of 128 and one of 2)
    "h16_i16_130_pairs": (130, 16, 16, 2, 1, [0, 1], [1, 0], {}),
    # gates of O(100): SiLU's exponential over its whole range (overflow to inf, underflow to 0)
    "large_gates": (40, 32, 32, 3, 2, [0, 1, 2], [1] * 3, {"gate_scale": 60.0}),
}


def build(name, seed=0):
    t_n, h, inter, e_n, k, local, probs, extra = CASES[name]
    gen = torch.Generator().manual_seed(seed + t_n * 31 + h)
    gate_up, down = experts_weights(e_n, h, inter, gen, extra.get("strided", False))
    gate_up[:, :inter] *= extra.get("gate_scale", 1.0)
    if extra.get("strided"):
        x = torch.randn(t_n, h + 5, generator=gen)[:, 2:h + 2]  # rows h + 5 apart
    else:
        x = torch.randn(t_n, h, generator=gen)
    tokens, weights, counts = routed_pairs(t_n, e_n, k, local, probs, gen)
    out = torch.randn(t_n, h, generator=gen) if extra.get("out") else None
    return x, tokens, weights, counts, local, gate_up, down, out


def test_the_cases_cover_what_they_claim():
    counts = {name: build(name)[3] for name in CASES}
    assert counts["h100_i40_empty_expert"][5] == 0 and min(counts["h100_i40_empty_expert"][:5]) > 0
    assert max(counts["top1_several_blocks"]) > 2 * RB
    assert counts["h16_i16_130_pairs"] == [130, 0]
    assert 0 < sum(counts["ep_local_2_3_of_5"]) < 60 * 2  # some pairs belong to other ranks
    x, *_, gate_up, down, _ = build("large_gates")
    gates = torch.einsum("eih,th->eti", gate_up[:, :32], x)
    assert float(gates.min()) < -90 and float(gates.max()) > 90
    x, *_, gate_up, down, _ = build("top4_permuted_out")
    assert x.stride(0) != x.shape[1] and gate_up.stride(1) != gate_up.shape[2] and down.stride(1) != down.shape[2]


@needs_kernel
@pytest.mark.parametrize("name", list(CASES))
def test_the_kernel_equals_an_independent_float64_loop(name):
    x, tokens, weights, counts, local, gate_up, down, out = build(name)
    given = None if out is None else out.clone()
    got = cpu_ops.experts(x, tokens, weights, counts, local, gate_up, down, out=given, threads=1)
    want = reference(x, tokens, weights, counts, local, gate_up, down, out)
    assert got.shape == x.shape and got.dtype == torch.float32
    if given is not None:
        assert got.data_ptr() == given.data_ptr()  # accumulated in place
    assert float((got.double() - want).abs().max()) <= 1e-5 * float(want.abs().max())
    # tokens with no local pair keep exactly what ``out`` held (zeros by default)
    idle = torch.ones(x.shape[0], dtype=torch.bool)
    idle[tokens] = False
    base = torch.zeros_like(got) if out is None else out
    assert torch.equal(got[idle], base[idle])


@needs_kernel
def test_the_activation_is_silu_to_float_precision_over_its_range():
    """An expert that passes its gate values through: x = [1, g_1 .. g_64], gate row i picks g_i, every
    up row picks the 1, down puts activation i in column i + 1 (all products by 0 or 1: exact), so
    out[:, 1:] = silu(g), compared value by value with float64 over [-100, 100]."""
    n, t_n = 64, 48
    g = torch.cat([torch.linspace(-100, 100, 16 * n), torch.linspace(-12, 12, 32 * n)]).view(t_n, n)
    x = torch.cat([torch.ones(t_n, 1), g], 1)
    gate_up = torch.zeros(1, 2 * n, n + 1)
    gate_up[0, torch.arange(n), torch.arange(n) + 1] = 1.0
    gate_up[0, n:, 0] = 1.0
    down = torch.zeros(1, n + 1, n)
    down[0, torch.arange(n) + 1, torch.arange(n)] = 1.0
    got = cpu_ops.experts(x, torch.arange(t_n), torch.ones(t_n), [t_n], [0], gate_up, down)
    want = g.double() / (1.0 + torch.exp(-g.double()))
    assert torch.equal(got[:, 0], torch.zeros(t_n))
    # a few ulp where |g| <= 12 (measured: 8e-7); past that g log2(e) itself is rounded (ulp x |g| in
    # the exponent), and under -87 the value is denormal or 0 (so is torch's)
    rel = torch.where(g.abs() <= 12, 2e-6, 1e-5).double()
    assert bool(((got[:, 1:].double() - want).abs() <= rel * want.abs() + 1e-36).all())


@needs_kernel
@pytest.mark.parametrize("threads", [1, 3])
def test_an_out_view_gets_only_its_own_columns(threads):
    x, tokens, weights, counts, local, gate_up, down, _ = build("h100_i40_empty_expert")
    wide = torch.full((x.shape[0], 103), 7.0)
    view = wide[:, 1:101]  # rows 103 apart
    cpu_ops.experts(x, tokens, weights, counts, local, gate_up, down, out=view, threads=threads)
    assert torch.equal(wide[:, 0], torch.full((x.shape[0],), 7.0))
    assert torch.equal(wide[:, 101:], torch.full((x.shape[0], 2), 7.0))
    want = reference(x, tokens, weights, counts, local, gate_up, down, torch.full((x.shape[0], 100), 7.0))
    assert float((view.double() - want).abs().max()) <= 1e-5 * float(want.abs().max())


@needs_kernel
@pytest.mark.parametrize("name", ["top1_several_blocks", "top4_permuted_out", "h100_i40_empty_expert"])
def test_threads_change_no_bit(name):
    x, tokens, weights, counts, local, gate_up, down, out = build(name)
    runs = [cpu_ops.experts(x, tokens, weights, counts, local, gate_up, down,
                            out=None if out is None else out.clone(), threads=n) for n in (1, 2, 3, 64)]
    for other in runs[1:]:
        assert torch.equal(runs[0], other)


@needs_kernel
def test_a_nan_input_row_reaches_only_its_token():
    x, tokens, weights, counts, local, gate_up, down, _ = build("h100_i40_empty_expert")
    clean = cpu_ops.experts(x, tokens, weights, counts, local, gate_up, down, threads=1)
    t0 = int(tokens[len(tokens) // 2])
    bad = x.clone()
    bad[t0, 37] = float("nan")
    for threads in (1, 3):
        got = cpu_ops.experts(bad, tokens, weights, counts, local, gate_up, down, threads=threads)
        assert bool(got[t0].isnan().all())
        others = torch.arange(x.shape[0]) != t0
        assert torch.equal(got[others], clean[others])  # the tokens gathered beside it: not a bit changed


@needs_kernel
def test_a_nan_weight_row_reaches_only_the_tokens_of_its_expert():
    x, tokens, weights, counts, local, gate_up, down, _ = build("h100_i40_empty_expert")
    clean = cpu_ops.experts(x, tokens, weights, counts, local, gate_up, down, threads=1)
    starts = [sum(counts[:i]) for i in range(len(counts) + 1)]
    slot = 2
    e = local[slot]
    routed = torch.zeros(x.shape[0], dtype=torch.bool)
    routed[tokens[starts[slot]:starts[slot + 1]]] = True
    assert routed.any() and not routed.all()

    gu = gate_up.clone()
    gu[e, 3] = float("nan")  # one gate row: every output of every pair of expert e
    got = cpu_ops.experts(x, tokens, weights, counts, local, gu, down, threads=2)
    assert bool(got[routed].isnan().all())
    assert torch.equal(got[~routed], clean[~routed])

    dn = down.clone()
    dn[e, 11] = float("nan")  # one down row: output column 11 of the pairs of expert e
    got = cpu_ops.experts(x, tokens, weights, counts, local, gate_up, dn, threads=1)
    want = torch.zeros_like(got, dtype=torch.bool)
    want[routed, 11] = True
    assert torch.equal(got.isnan(), want)

    # the expert without pairs and an expert of another rank are never read
    gu = gate_up.clone()
    gu[5] = float("nan")
    assert torch.equal(cpu_ops.experts(x, tokens, weights, counts, local, gu, down, threads=1), clean)
    x, tokens, weights, counts, local, gate_up, down, out = build("ep_local_2_3_of_5")
    clean = cpu_ops.experts(x, tokens, weights, counts, local, gate_up, down, out=out.clone())
    gu, dn = gate_up.clone(), down.clone()
    gu[[0, 1, 4]] = float("nan")
    dn[[0, 1, 4]] = float("nan")
    assert torch.equal(cpu_ops.experts(x, tokens, weights, counts, local, gu, dn, out=out.clone()), clean)


# --- refusals (checked before the library is called: no kernel needed) -----------------------------

def test_arguments_the_kernel_cannot_take_are_refused_by_name():
    x, tokens, weights, counts, local, gate_up, down, _ = build("h100_i40_empty_expert")
    t_n, h = x.shape
    args = dict(tokens=tokens, weights=weights, counts=counts, local=local, gate_up=gate_up, down=down)

    def call(**changes):
        return cpu_ops.experts(changes.pop("x", x), **{**args, **changes})

    with pytest.raises(ValueError, match=r"gate_up \(6, 80, 101\), down \(6, 100, 40\) do not fit x \(80, 100\)"):
        call(gate_up=torch.zeros(6, 80, 101))
    with pytest.raises(ValueError, match=r"down \(6, 100, 41\) do not fit x \(80, 100\)"):
        call(down=torch.zeros(6, 100, 41))
    with pytest.raises(ValueError, match=r"gate_up \(6, 81, 100\)"):  # an odd 2I
        call(gate_up=torch.zeros(6, 81, 100))
    with pytest.raises(ValueError, match=r"5 counts for 6 experts"):
        call(counts=counts[:5])
    with pytest.raises(ValueError, match=rf"{len(tokens)} pairs but tokens \({len(tokens) - 1},\)"):
        call(tokens=tokens[1:])
    with pytest.raises(ValueError, match=rf"{len(tokens)} pairs but tokens .*weights \({len(tokens) + 1},\)"):
        call(weights=torch.ones(len(tokens) + 1))
    with pytest.raises(ValueError, match=r"local experts \[0, 1, 2, 3, 4, 6\] outside \[0, 6\)"):
        call(local=[0, 1, 2, 3, 4, 6])
    with pytest.raises(ValueError, match=r"outside \[0, 6\)"):
        call(local=[-1, 1, 2, 3, 4, 5])
    for bad in (t_n, -1):
        ids = tokens.clone()
        ids[-1] = bad
        with pytest.raises(ValueError, match=rf"token ids outside \[0, {t_n}\)"):
            call(tokens=ids)
    for out in (torch.zeros(t_n + 1, h), torch.zeros(t_n, h, dtype=torch.float64), torch.zeros(h, t_n).t(),
                torch.zeros(t_n, h, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match=rf"out .* is not a \[{t_n}, {h}\] float32 row-major tensor"):
            call(out=out)


# --- routing: MoE and VPP_CPU_OPS -------------------------------------------------------------------

def qwen_moe(dtype=torch.float32, seed=0):
    """A Qwen3-style MoE block (softmax top-2 of 8, renormalised, SiLU, no shared expert), one rank,
    random O(1) weights (router logits O(1): top-k gaps far above rounding)."""
    cfg = MoEConfig(64, 40, 8, 2, norm_topk_prob=True)
    moe = MoE(cfg, ParallelGroups.single(), dispatch="allreduce", dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]) * 3.0)
    return moe


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = cpu_ops.experts
    monkeypatch.setattr(cpu_ops, "experts", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    return calls


@needs_kernel
def test_moe_runs_the_kernel_and_matches_the_reference_path(monkeypatch, counted):
    moe = qwen_moe()
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(1))
    monkeypatch.setenv("VPP_CPU_OPS", "auto")
    assert moe.experts.fused_cpu(x)
    fused = moe(x)
    assert counted == [x.shape]
    monkeypatch.setenv("VPP_CPU_OPS", "torch")
    assert not moe.experts.fused_cpu(x)
    ref = moe(x)
    assert counted == [x.shape]  # the reference loop: not the kernel
    assert float((fused - ref).abs().max()) <= 1e-5 * float(ref.abs().max())
    # and both equal the block written out in float64 from the router's choice
    weights, ids = moe.gate(x)
    want = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist()):
            want[t] += reference(x[t:t + 1], torch.zeros(1, dtype=torch.int64), torch.tensor([w]), [1], [e],
                                 moe.experts.gate_up_proj, moe.experts.down_proj)[0]
    assert float((fused.double() - want).abs().max()) <= 1e-5 * float(want.abs().max())
    monkeypatch.setenv("VPP_CPU_OPS", "vpp")
    assert torch.equal(moe(x), fused)
    assert len(counted) == 2


def test_bf16_and_other_activations_do_not_go_to_the_kernel(monkeypatch, counted):
    monkeypatch.setenv("VPP_CPU_OPS", "auto")
    moe = qwen_moe(torch.bfloat16)
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    assert not moe.experts.fused_cpu(x)
    assert not cpu_ops.supports(x, moe.experts.gate_up_proj, moe.experts.down_proj, "silu")
    assert moe(x).dtype == torch.bfloat16 and counted == []
    f32 = [t.float() for t in (x, moe.experts.gate_up_proj, moe.experts.down_proj)]
    assert not cpu_ops.supports(*f32, "gelu")
    assert not cpu_ops.supports(f32[0][None], *f32[1:], "silu")  # not a [T, H] matrix


def test_a_mode_that_is_not_one_is_refused_naming_the_variable(monkeypatch):
    moe = qwen_moe()
    x = torch.randn(40, 64)
    monkeypatch.setenv("VPP_CPU_OPS", "bogus")
    with pytest.raises(ValueError, match=r"VPP_CPU_OPS='bogus' is not one of \('auto', 'vpp', 'torch'\)"):
        cpu_ops.supports(x, moe.experts.gate_up_proj, moe.experts.down_proj, "silu")
    with pytest.raises(ValueError, match="VPP_CPU_OPS"):
        moe(x)


def test_an_unusable_kernel_falls_back_or_fails_when_required(monkeypatch, counted):
    monkeypatch.setattr(cpu_ops, "_state", {"lib": None, "why": "no compiler (test)"})
    moe = qwen_moe()
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(1))
    args = (x, moe.experts.gate_up_proj, moe.experts.down_proj, "silu")
    assert cpu_ops.library() is None and cpu_ops.unavailable_reason() == "no compiler (test)"
    monkeypatch.setenv("VPP_CPU_OPS", "auto")
    assert not cpu_ops.supports(*args) and not moe.experts.fused_cpu(x)
    out = moe(x)  # the reference path
    assert counted == [] and bool(out.isfinite().all())
    monkeypatch.setenv("VPP_CPU_OPS", "vpp")
    with pytest.raises(RuntimeError, match=r"VPP_CPU_OPS=vpp but vpp's CPU ops \(MoE, RMSNorm, RoPE\) cannot run here: "
                                           r"no compiler \(test\)"):
        cpu_ops.supports(*args)
    with pytest.raises(RuntimeError, match="no compiler"):
        moe(x)
    monkeypatch.setenv("VPP_CPU_OPS", "torch")
    assert torch.equal(moe(x), out)
