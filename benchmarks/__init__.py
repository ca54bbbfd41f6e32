"""Measured and simulated claims: each script makes one claim, prints a table and writes its results to
``benchmarks/results/``, and imports no other script (only vpp; the paper study, ``benchmarks/paper/``, is one
script with its own modules). Run them from the repository root as modules (``python -m benchmarks.NAME``)
or as files with the checkout on the path (``PYTHONPATH=. python benchmarks/NAME.py``)."""
