"""The paper's published figures (arXiv 2608.26523),
kept in one place so reproductions compare against the same numbers.

Setting: 16 x Ascend 910C NPUs (64 GB each), TP8 + PP2, vLLM-Ascend 0.23; DCPP with vLLM-Ascend's
recommended settings (minimum chunk 4096, smoothing 1.0); chunk budgets {8K, 16K, 24K, 32K}, best
reported. Times are seconds per rank (compute + bubble + exposed communication = total).
"""

from __future__ import annotations

CHUNKS = (8192, 16384, 24576, 32768)
MODELS_ALL = ("deepseek-v3.1", "glm-5.2", "qwen3-coder-30b-a3b")
LENGTHS = (65536, 131072, 262144, 524288, 1048576)

# Table 1 (Sec. 4) and Table 2 (Sec. 6.3): DeepSeek-V3.1, 512K tokens, chunk budget 24K.
TABLE_512K = {
    "cpp": {"compute": 252.59, "bubble": 38.64, "exposed_comm": 16.67, "total": 307.90},
    "dcpp": {"compute": 279.07, "bubble": 20.47, "exposed_comm": 22.68, "total": 322.22},
    "vpp": {"compute": 250.84, "bubble": 0.39, "exposed_comm": 30.63, "total": 322.22 - 40.36},
}
# Table 2 (b): computation detail, DCPP vs VPP (kernel categories of the Ascend profiler).
COMPUTE_DETAIL_512K = {
    "dcpp": {"Attention": 228.13, "Slice": 22.90, "MatMulV3": 13.06},
    "vpp": {"Attention": 233.08, "Slice": 5.18, "MatMulV3": 2.54},
}
# Table 2 (c) bubble detail and the overlap ratios of Sec. 7.4.
BUBBLE_DETAIL_512K = {"dcpp": {"Free": 18.61, "Launch stall": 1.85}, "vpp": {"Free": 0.39, "Launch stall": 0.00036}}
OVERLAP_RATIO_512K = {"dcpp": 0.0005, "vpp": 0.5175}

STEPS = {"cpp_128k": 8, "dcpp_128k": 17, "dcpp_over_cpp_512k": 4.4}   # Fig. 1(b); Sec. 1 ("4.4x more steps")

CLAIMS = {
    "dcpp_vs_cpp": "DeepSeek: DCPP wins by 1.6-3.6% on 64K-256K, loses 4.4% throughput / 4.6% TTFT at 512K",
    "vpp_vs_dcpp_deepseek": "VPP over DCPP 2.6%-13.1% on DeepSeek (64K-512K), growing with length",
    "vpp_vs_dcpp_qwen": "VPP over DCPP 3.7%-8.7% on Qwen (128K-512K)",
    "vpp_vs_dcpp_glm": "GLM: VPP over DCPP peaks at 64K (8.5%) and narrows; no GLM data at 512K/1M",
    "vpp_vs_cpp": "VPP over CPP up to 7.3% (Qwen), 10.0% (DeepSeek), 4.1% (GLM) throughput",
    "chunk_24k": "24K is the best chunk in most configurations (its ragged last chunk runs in the drain); "
                 "at 64K on DeepSeek/GLM smaller chunks are better",
}
VPP_OVER_DCPP_512K = 0.131          # "about 13.1% over DCPP" (DeepSeek, 512K)

# Table 2 text: overlap ratios and the AllGather facts (Sec. 6.3).
ALLGATHER_512K = {"calls_dcpp_over_vpp": 4.58, "latency_vpp_over_dcpp": 11.0, "overhead_increase_s": 5.27,
                  "overhead_increase": 0.397}

# Long sequences (Fig. 4 / Sec. 6.2), in the paper's metric, throughput gain (single requests: throughput =
# tokens / TTFT, so gain = TTFT_base / TTFT - 1). A value is a point, a (lo, hi) pair a range the claim
# spans, ("max", v) the largest gain over the lengths the paper reports for that model.
LONG_GAINS = {
    ("deepseek-v3.1", "dcpp", "cpp"): {65536: (0.016, 0.036), 131072: (0.016, 0.036), 262144: (0.016, 0.036),
                                       524288: -0.044},
    ("deepseek-v3.1", "vpp", "dcpp"): {65536: 0.026, 524288: 0.131},
    ("deepseek-v3.1", "vpp", "cpp"): {"max": 0.100},
    ("qwen3-coder-30b-a3b", "vpp", "dcpp"): {131072: 0.037, 524288: 0.087},
    ("qwen3-coder-30b-a3b", "vpp", "cpp"): {"max": 0.073},
    ("glm-5.2", "vpp", "dcpp"): {65536: 0.085},
    ("glm-5.2", "vpp", "cpp"): {"max": 0.041},
}
LONG_LENGTHS = {"deepseek-v3.1": LENGTHS, "qwen3-coder-30b-a3b": LENGTHS, "glm-5.2": LENGTHS[:3]}  # no GLM 512K/1M

# Fig. 3 / Sec. 6.2: mixed (500 GSM8K-derived requests, concurrency 16) and short (100 concurrent
# requests of 4K / 8K / 16K) streams, throughput gain of VPP (all optimisations) over each baseline.
MIXED_GAINS = {("qwen3-coder-30b-a3b", "cpp"): 0.090, ("qwen3-coder-30b-a3b", "dcpp"): 0.008,
               ("deepseek-v3.1", "cpp"): 0.138, ("deepseek-v3.1", "dcpp"): 0.067,
               ("glm-5.2", "cpp"): (0.013, 0.016), ("glm-5.2", "dcpp"): (0.013, 0.016)}
SHORT_CLAIMS = {"qwen_vs_cpp_worst": -0.068, "deepseek_vs_dcpp_best": 0.108,
                "vs_dcpp": "almost no regression (comparable on Qwen and GLM)"}

# Sec. 6.4 ablation: DeepSeek 256K, 32K chunks, 3 concurrent requests.
# VPP -> VPP-Async: non-overlapped communication -48%, overlap ratio 0.02% -> 54.03%; + packing: the
# cross-request bubble -33.2%; computation differs by at most 0.82 s (0.42%) across the three.
ABLATION_256K = {"async_gain": 0.0313, "packing_gain_total": 0.0689,
                 "bubble_ratio": {"vpp": 0.110, "vpp-async": 0.083, "vpp-packed": 0.024},
                 "async_exposed_cut": 0.48, "overlap": {"vpp": 0.0002, "vpp-async": 0.5403},
                 "packing_bubble_cut": 0.332, "compute_spread": 0.82}


__all__ = [
    "ABLATION_256K", "ALLGATHER_512K", "BUBBLE_DETAIL_512K", "CHUNKS", "CLAIMS", "COMPUTE_DETAIL_512K",
    "LENGTHS", "LONG_GAINS", "LONG_LENGTHS", "MIXED_GAINS", "MODELS_ALL", "OVERLAP_RATIO_512K",
    "SHORT_CLAIMS", "STEPS", "TABLE_512K", "VPP_OVER_DCPP_512K",
]
