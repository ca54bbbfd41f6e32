"""The measurement harness behind the commands: prefill schedules and request streams timed on real
ranks (``vpp prefill``, ``vpp serve-bench``), request streams in the simulator (``vpp serve-sim``), the
paper's published figures and the cost-model fit on them (``vpp tune --fit-paper``), and timing this CPU
(``vpp calibrate``). Library code never imports it; ``benchmarks/`` scripts and the CLI do."""

__all__: list[str] = []  # import the submodules by name
