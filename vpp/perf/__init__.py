"""Paper-scale performance model: model configs, per-layer FLOPs/bytes, device presets and a cost model
that plugs into the schedule simulator (:mod:`vpp.schedules`)."""
