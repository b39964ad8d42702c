"""``gt_core.jit``: the decorator, and a jitted function's cache of call keys.

A call key is what a call's arguments are (its tensors' metadata, its other arguments'
values); each key has its own recorded calls and replay (``entry.Entry``). The contract a
replayed call keeps is the package's (``gt_core.client.jit``).
"""

from __future__ import annotations

import functools
import types

import torch
from torch.utils._pytree import tree_flatten

from gt_core.client import capture as _capture
from gt_core.client.jit.entry import Entry
from gt_core.client.recording.meta import where_free_key
from gt_core.client.recording.proxy import Proxy
from gt_core.client.recording.uploads import upload
from gt_core.client.session import LOCK

__all__ = ["jit", "Jit"]


def jit(fn=None):
    """Replay ``fn``'s block once two calls recorded it alike (see the module's contract).

    In [1]: @gt_core.jit
       ...: def step(x, y):
       ...:     loss = F.mse_loss(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
       ...:     return loss
    """
    if fn is None:
        return jit
    return functools.wraps(fn)(Jit(fn))


class Jit:
    """A jitted function: a cache of one entry per call key (see :class:`gt_core.client.jit.entry.Entry`)."""

    def __init__(self, fn):
        self.fn = fn
        self.name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
        self.entries: dict = {}

    def __get__(self, obj, cls=None):  # a jitted method binds like a function
        return self if obj is None else types.MethodType(self, obj)

    def __call__(self, *args, **kwargs):
        s = _capture.current_session()
        if s is None:  # outside a capture: an ordinary call
            return self.fn(*args, **kwargs)
        if not kwargs and all(isinstance(a, torch.Tensor) for a in args):
            leaves, spec = list(args), len(args)  # the common case, without pytree
            if not all(type(a) is Proxy for a in leaves):  # (a host batch: uploaded)
                with LOCK:
                    leaves = [a if type(a) is Proxy else upload(Proxy, s, a) for a in leaves]
        else:
            leaves, spec = tree_flatten((args, kwargs))
            with LOCK:
                leaves = [upload(Proxy, s, x) if _plain_tensor(x) else x for x in leaves]
        key = _key(leaves, spec)
        if key is None:
            return self.fn(*args, **kwargs)  # an argument that cannot be a key: no cache
        entry = self.entries.get(key)
        if entry is None or entry.session is not s:
            entry = self.entries[key] = Entry(self, s, len(self.entries))
        return entry.call(leaves, spec)

    def __repr__(self) -> str:
        return f"<gt_core.jit of {self.name}: {len(self.entries)} key(s)>"


def _plain_tensor(x) -> bool:
    return isinstance(x, torch.Tensor) and not isinstance(x, Proxy)


def _key(leaves, spec):
    parts = [spec]
    for x in leaves:
        if type(x) is Proxy:
            parts.append((where_free_key(x), x.requires_grad))
        else:
            parts.append((type(x), x))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key
