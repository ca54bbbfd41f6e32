"""Measured and simulated claims: each script prints a table and writes its results to
``benchmarks/results/``. Run them from the repository root as modules (``python -m benchmarks.NAME``)
or as files with the checkout on the path (``PYTHONPATH=. python benchmarks/NAME.py``)."""
