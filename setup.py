from setuptools import find_packages, setup

setup(
    name="vpp",
    version="0.1.0",
    description="Virtual Pipeline Parallelism for long-context chunked prefill (PyTorch)",
    packages=find_packages(include=["vpp", "vpp.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "einops", "safetensors", "numpy"],
    extras_require={
        "test": ["pytest", "pytest-timeout", "transformers>=5.0", "hypothesis"],
        "npu": ["torch_npu"],
        "plot": ["matplotlib"],
    },
    entry_points={"console_scripts": ["vpp=vpp.cli:main"]},
)
