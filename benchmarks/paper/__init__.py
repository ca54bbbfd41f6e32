"""The paper study: one script, ``paper_repro.py`` (``python -m benchmarks.paper.paper_repro``), and its own
modules: the published figures of the VPP paper, the fit of the device constants they do not give, the sweeps,
the paper-scale request streams, the cells and their scoring, the mechanisms. The library never imports it."""
