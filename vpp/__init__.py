"""vpp: tensor-parallel layers and pipeline schedules for long-context chunked prefill.

Vocabulary (used the same way in every module, docstring and error message):

* ``rank``    -- a pipeline rank, 0 .. P-1 (a position along the ``pp`` mesh axis). Where a global
  process rank is meant, the text says "global rank".
* ``stage``   -- a virtual pipeline stage, 0 .. S-1: a contiguous range of layers. A layout maps each
  stage to one rank; a rank may hold several stages (the V layout gives each rank two).
* ``chunk``   -- a contiguous slice of one request's prompt tokens, processed as one unit.
* ``request`` -- one prompt. Each request has its own KV cache on every stage.
* ``layer``   -- a transformer layer, numbered globally as in the checkpoint (0 .. num_layers-1).
* ``axis``    -- a mesh axis (``tp``, ``pp``, ``ep``, ``dp``); ``dim`` -- a tensor dimension.

Rooms, top to bottom (a room imports only rooms below it; README "Layout"): :mod:`vpp.cli` (the
commands and the engines behind them), :mod:`vpp.kv` (KV caches moving between instances) and
:mod:`vpp.testing` (doubles of devices CPUs lack), :mod:`vpp.runtime` (plans on process groups; the
prefill calls and ``Pipeline``) and :mod:`vpp.models` (model families, checkpoints, a run's layout),
:mod:`vpp.perf` (paper-scale cost model, memory plan) and :mod:`vpp.transformer` (what a layer
computes), :mod:`vpp.parallel` (who talks to whom), :mod:`vpp.schedules` (what runs when, as data) and
:mod:`vpp.config` (the Hugging Face config reader).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
