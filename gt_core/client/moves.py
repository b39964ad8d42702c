"""Moving the user's objects to the worker: ``gt_core.to_worker``."""

from __future__ import annotations

import torch

from gt_core.client.capture import session
from gt_core.client.recording.proxy import Proxy
from gt_core.client.recording.uploads import upload
from gt_core.client.session import LOCK

__all__ = ["to_worker"]


def to_worker(obj):
    """Move a tensor, an nn.Module (in place) or an optimizer's state to the worker."""
    with LOCK:
        return _to_worker(obj)


def _to_worker(obj):
    s = session()
    if isinstance(obj, Proxy):
        return obj
    if isinstance(obj, torch.Tensor):
        p = upload(Proxy, s, obj, cache=False)
        if obj.requires_grad:
            p = p.detach().requires_grad_(True)
        return (
            torch.nn.Parameter(p, requires_grad=obj.requires_grad)
            if isinstance(obj, torch.nn.Parameter)
            else p
        )
    if isinstance(obj, torch.nn.Module):
        for t in [*obj.parameters(), *obj.buffers()]:
            if not isinstance(t, Proxy):
                new = _to_worker(t)
                torch.utils.swap_tensors(t, new)
        return obj
    if isinstance(obj, torch.optim.Optimizer):
        for state in obj.state.values():
            for k, v in list(state.items()):
                if isinstance(v, torch.Tensor) and not isinstance(v, Proxy):
                    state[k] = _to_worker(v)
        return obj
    raise TypeError(
        f"gt_core.to_worker: expected a Tensor, nn.Module or Optimizer, got {type(obj).__name__}"
    )
