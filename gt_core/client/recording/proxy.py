"""Proxies: tensors whose data lives on the worker.

A proxy is a wrapper tensor subclass holding only metadata and a value id. The class says
where each of its behaviours lives: every aten op on a proxy is recorded, not run
(``__torch_dispatch__``: ``record``); pickling, copies and moves to the CPU are
``tensor_io``'s; plain tensors an op meets are uploaded (``uploads``). Those modules make
proxies of the class their caller passes (the dispatch passes ``cls``), so none of them
imports this one. Its fields (its value's id, session, metadata, shadow) are
``proxy_fields``'s: read as attributes anywhere, written only through its functions.
"""

from __future__ import annotations

import torch

from gt_core.client.interrupt import STATE as HELD
from gt_core.client.interrupt import check as check_interrupt
from gt_core.client.recording import tensor_io
from gt_core.client.recording.proxy_fields import ProxyFields, make
from gt_core.client.recording.record import in_forked_child, record
from gt_core.client.recording.tensor_io import is_fetched, mark_fetched
from gt_core.client.recording.uploads import rebind, upload
from gt_core.client.session import FORKED, LOCK
from gt_core.stream.meta import TensorMeta

__all__ = ["Proxy", "is_remote"]

_wrapper = torch.Tensor._make_wrapper_subclass  # _CPU (below): a device parses faster than "cpu"


class Proxy(torch.Tensor, ProxyFields):
    """A tensor whose value lives on the gt worker; ops on it are recorded, not run here."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ARG003
        """Every aten op on a proxy is recorded (``record``), not run here."""
        if FORKED[0]:
            return in_forked_child(cls, func, args, kwargs or {})
        with LOCK:
            if HELD["pending"]:
                check_interrupt()  # a Ctrl-C held during gt's last op: raised here, between ops
            return record(cls, func, args, kwargs or {})

    # -- moves to files, copies and devices (tensor_io) ----------------------------------
    def to(self, *args, **kwargs):
        """torch's ``to``; outside a capture, ``to('cpu')`` fetches (see tensor_io.to)."""
        return tensor_io.to(self, args, kwargs)

    __reduce_ex__ = tensor_io.reduce  # pickled (torch.save) as the plain tensor it stands for
    __copy__ = (
        tensor_io.shallow_copy
    )  # shares this value on the worker, as copy.copy shares storage
    __deepcopy__ = tensor_io.deepcopy  # a copy made on the worker (a recorded clone)

    @staticmethod
    def __new__(cls, session, vid: int, meta: TensorMeta, mid: int | None = None):
        shape, stride, dtype, offset = meta
        if offset:
            r = _wrapper(
                cls, shape, strides=stride, storage_offset=offset, dtype=dtype, device=_CPU
            )
        else:  # the common case: each keyword passed is parsed, at a cost
            r = _wrapper(cls, shape, strides=stride, dtype=dtype, device=_CPU)
        make(r, session, vid, meta, mid)
        return r

    def __del__(self):
        s = self.__dict__.get("gt_session")  # absent: __new__ failed before make
        if s is not None and not s.closed:
            s.freed.append(self.gt_value_id)  # joins the stream before the next instruction
            s.counters["frees"] += 1

    # -- sync points that do not pass through the dispatcher ------------------------------
    def cpu(self, memory_format=torch.preserve_format) -> torch.Tensor:  # noqa: ARG002
        """The value as a plain CPU tensor: a copy of its shadow where it has one (as
        ``item()`` answers; a DataLoader's ``randperm(n).tolist()`` every epoch), else
        fetched from the worker (which waits for it)."""
        s = self.gt_session
        s.check()
        if self.gt_shadow is not None:
            with torch._C._DisableTorchDispatch():
                return mark_fetched(self.gt_shadow.clone())
        return mark_fetched(s.fetch(self.gt_value_id))

    def numpy(self, *, force: bool = False):  # noqa: ARG002
        return self.cpu().numpy()

    def tolist(self):
        return self.cpu().tolist()

    def item(self):
        """The value as a Python number. While a jitted call records, a float read from a
        shadow comes back as the log made it (jit.program: it knows where it came from),
        which torch's own ``item`` would turn into a plain float."""
        v = super().item()
        log = self.gt_session.shadow_log if self.gt_session is not None else None
        return v if log is None else log.took(v)

    def __array__(self, dtype=None, copy=None):  # noqa: ARG002
        a = self.cpu().numpy()
        return a if dtype is None else a.astype(dtype)

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(spec)
        return self.__repr__().__format__(spec)

    def __repr__(self, *, tensor_contents=None) -> str:  # noqa: ARG002
        s = self.gt_session
        if s.closed or s.dead is not None:
            why = "its worker died" if s.dead is not None else "its worker is gone"
            return f"<gt worker tensor {list(self.shape)} {self.dtype}: {why}>"
        text = repr(self.cpu())
        extra = []
        if self.grad_fn is not None:
            extra.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
        elif self.requires_grad:
            extra.append("requires_grad=True")
        if extra and text.endswith(")"):
            text = text[:-1] + ", " + ", ".join(extra) + ")"
        return text + " (gt worker tensor)"

    __str__ = __repr__

    @property
    def data(self):
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, other):
        # `p.data = x` (Module.to, .double(), user code): p takes x's value under a new id of
        # its own, so freeing x later does not free p's value.
        with LOCK:
            if not isinstance(other, Proxy):
                if is_fetched(other):  # a move to the CPU (Module.cpu()): p becomes that tensor
                    tensor_io.become_plain(self, other)
                    return
                other = upload(Proxy, self.gt_session, other)
            fresh = torch.ops.aten.alias.default(other)
            rebind(self, fresh)


def is_remote(t) -> bool:
    """True when ``t`` is a gt worker tensor (its data lives in the worker)."""
    return isinstance(t, Proxy)


_CPU = torch.device("cpu")
