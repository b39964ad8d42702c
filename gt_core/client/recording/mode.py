"""CaptureMode: inside capture, factories and ops on worker tensors are recorded.

(One that draws from an explicit ``torch.Generator`` runs here instead: ``generators``.)
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from gt_core.client.interrupt import STATE as HELD
from gt_core.client.interrupt import check as check_interrupt
from gt_core.client.recording.generators import draws, has_generator
from gt_core.client.recording.record import in_forked_child, record
from gt_core.client.session import FORKED, LOCK

__all__ = ["CaptureMode", "capture_mode", "made_on_host"]


class CaptureMode(TorchDispatchMode):
    """Inside capture, every aten op (factories included) is recorded for the worker, its
    new tensors proxies of ``proxy_cls`` (gt_core.client.recording.proxy's, which capture passes)."""

    def __init__(self, proxy_cls):
        super().__init__()
        self.proxy_cls = proxy_cls


def capture_mode() -> CaptureMode | None:
    """The capture's mode when one is active on this thread, else None."""
    for m in _get_current_dispatch_mode_stack():
        if isinstance(m, CaptureMode):
            return m
    return None


def _capture_dispatch(self, func, types, args=(), kwargs=None):
    kwargs = kwargs or {}
    cls = self.proxy_cls
    if FORKED[0]:  # a fork of the kernel (a DataLoader's worker): its tensors are plain
        return in_forked_child(cls, func, args, kwargs)
    # ``types``: the tensor subclasses among the arguments (lists and out= included), found
    # by torch in C; the scans below run only for ops that may make a tensor from nothing.
    if cls not in types and not _made_here(func, args, kwargs):
        if not draws(func) or has_generator(args, kwargs):
            # Plain tensors from outside stay plain (numpy(), printing, torch internals and
            # a DataLoader's indexing and collate use them), and so do bookkeeping ops such
            # as profiler ranges.
            return func(*args, **kwargs)
        # A draw from the global generator on plain tensors (or none): eager's stream is the
        # worker's. Recorded, its plain tensors go up, and one it writes in place gets its
        # new value back, as with any op recorded in place on a plain tensor.
        fetch = getattr(_fetching, "on", None)
        if fetch is not None:
            fetch.draws += 1
    # an op on worker tensors, a factory or a draw: the new tensor lives on the worker
    with LOCK:
        if HELD["pending"]:
            check_interrupt()
        return record(cls, func, args, kwargs)


_PLAIN, _LIFT, _FACTORY = range(3)
_kinds: dict[int, int] = {}  # id(op) -> what it does without a worker tensor (ops live forever)


def _made_here(func, args, kwargs) -> bool:
    """Whether an op without worker tensors makes a new tensor of the capture: a lift
    (torch.tensor(data)) or a factory (tensor outputs, no tensor inputs). None does while
    this thread fetches a DataLoader batch (made_on_host), but for a draw (see above)."""
    kind = _kinds.get(id(func))
    if kind is None:
        kind = _LIFT if func in _LIFTS else _FACTORY if _makes_tensors(func) else _PLAIN
        _kinds[id(func)] = kind
    if kind == _PLAIN or getattr(_fetching, "on", None) is not None:
        return False
    if kind == _FACTORY:
        return not _has_tensor(args) and not _has_tensor(kwargs.values())
    return True


_fetching = threading.local()  # .on: the Fetch of this thread's DataLoader batch, or None


class Fetch:
    """A DataLoader batch in the making (made_on_host): its draws from the global generator."""

    __slots__ = ("draws",)

    def __init__(self):
        self.draws = 0


@contextlib.contextmanager
def made_on_host():
    """Inside, tensors this thread makes from nothing are plain host tensors, as a
    DataLoader's batches are in eager (torch.tensor, torch.from_numpy, zeros in a dataset's
    ``__getitem__``, the collate's stacks); a draw from the global generator is still the
    worker's, where eager's stream is. Each was a worker tensor: an upload or a recorded op
    per row, and the batch stacked on the worker, op by op every step. Yields the Fetch."""
    was = getattr(_fetching, "on", None)
    _fetching.on = fetch = Fetch()
    try:
        yield fetch
    finally:
        _fetching.on = was


# Assigned after the class is made: TorchDispatchMode.__init_subclass__ would wrap it in
# torch._disable_dynamo, which costs several µs on every recorded op.
CaptureMode.__torch_dispatch__ = _capture_dispatch


# torch.tensor(data) builds a plain tensor, then lifts it: that is where it becomes ours.
_LIFTS = (
    torch.ops.aten.lift_fresh.default,
    torch.ops.aten.lift_fresh_copy.default,
    torch.ops.aten.lift.default,
)


_tensor_returns: dict = {}


def _makes_tensors(func) -> bool:
    r = _tensor_returns.get(func)
    if r is None:
        r = _tensor_returns[func] = any("Tensor" in str(x.type) for x in func._schema.returns)
    return r


def _has_tensor(xs) -> bool:
    for x in xs:
        if isinstance(x, torch.Tensor) or (type(x) in (list, tuple) and _has_tensor(x)):
            return True
    return False
