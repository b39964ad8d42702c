"""A project's own torch.library ops, importable by the worker (worker_imports=("_custom_ops",)).

The tests directory is on the client's sys.path under pytest, and a spawned worker starts
with its client's sys.path, so the worker finds this module by the same name.
"""

import torch


@torch.library.custom_op("gt_tests::scale_add", mutates_args=())
def scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha + y


@scale_add.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)


@torch.library.custom_op("gt_tests::row_max", mutates_args=())
def row_max(x: torch.Tensor) -> torch.Tensor:
    """No fake kernel: the client cannot infer its output, so it runs on the worker at once."""
    return x.amax(dim=-1)
