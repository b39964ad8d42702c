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


# Kernels that return None for an output their schema and fake kernel give as a tensor.
_lib = torch.library.Library("gt_tests", "FRAGMENT")
_lib.define("kept(Tensor x) -> (Tensor, Tensor)")
_lib.define("dropped(Tensor x) -> (Tensor, Tensor)")


def _kept(x):
    """Its second output only with grad mode on (as aten.mkldnn_rnn_layer's workspace)."""
    return x * 2, (x + 1 if torch.is_grad_enabled() else None)


def _dropped(x):
    """Its second output never."""
    return x * 2, None


def _two_like(x):
    return torch.empty_like(x), torch.empty_like(x)


for _name, _kernel in (("kept", _kept), ("dropped", _dropped)):
    _lib.impl(_name, _kernel, "CPU")
    torch.library.register_fake(f"gt_tests::{_name}", _two_like, lib=_lib)
