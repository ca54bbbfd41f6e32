"""``initialize_model_parallel`` refuses sizes that make no grid before it touches torch.distributed
(so these need no process group): 0 was a ZeroDivisionError, 1.5 "does not divide", "2" a TypeError."""

from __future__ import annotations

import pytest

from vpp.parallel import initialize_model_parallel


@pytest.mark.parametrize("args, kw, message", [
    ((0, 1), {}, r"tensor_model_parallel_size=0 must be an integer >= 1"),
    ((1, 0), {}, r"pipeline_model_parallel_size=0 must be an integer >= 1"),
    ((-1, 2), {}, r"tensor_model_parallel_size=-1 must be an integer >= 1"),
    ((1.5, 1), {}, r"tensor_model_parallel_size=1.5 must be an integer >= 1"),
    ((1, "2"), {}, r"pipeline_model_parallel_size='2' must be an integer >= 1"),
    ((True, 1), {}, r"tensor_model_parallel_size=True must be an integer >= 1"),
    ((1, 1, 0), {}, r"expert_model_parallel_size=0 must be an integer >= 1"),
])
def test_sizes_that_make_no_grid_are_one_line(args, kw, message):
    with pytest.raises(ValueError, match=message):
        initialize_model_parallel(*args, **kw)
