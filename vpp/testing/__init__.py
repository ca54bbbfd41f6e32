"""Doubles of what CPUs do not have, for tests and benchmarks: an emulated NCCL device (streams, events,
the ordering rules of ProcessGroupNCCL; :mod:`.emulated_device`), a run of real plans on it
(:mod:`.emulated_run`), and loopback stream operations between threads (:mod:`.loopback`). The library
never imports this room."""
