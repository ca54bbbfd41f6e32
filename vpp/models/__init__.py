"""What is computed: Qwen3-MoE, DeepSeek-V3/V3.2 and GLM-5 stages built from vpp.parallel parts."""
