"""Proxies: tensors whose data lives on the worker, and uploads of plain tensors to it.

A proxy is a wrapper tensor subclass holding only metadata and a value id. Each aten op on a
proxy is recorded, not run (see ``record``). Plain tensors an op meets are uploaded once and
cached while they are unchanged. A 0-d upload carries a shadow, a plain copy of its value
(see ``shadows``).
"""

from __future__ import annotations

import weakref

import torch

from gt_core.client.interrupt import user_line
from gt_core.client.session import LOCK
from gt_core.errors import UnsupportedOperation
from gt_core.stream.instructions import OP, PUT, Op, Put
from gt_core.stream.meta import TensorMeta, tensor_meta
from gt_core.stream.staging import layout

__all__ = ["Proxy", "upload", "is_remote"]

_meta_ids: dict[TensorMeta, int] = {}


def meta_id(meta: TensorMeta) -> int:
    """A small int per distinct metadata: what cache keys hold for a tensor (cheap to hash)."""
    mid = _meta_ids.get(meta)
    if mid is None:
        mid = _meta_ids[meta] = len(_meta_ids)
    return mid


_wrapper = torch.Tensor._make_wrapper_subclass  # _CPU (below): a device parses faster than "cpu"


class Proxy(torch.Tensor):
    """A tensor whose value lives on the gt worker; ops on it are recorded, not run here."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    _gt_v = None  # the shadow: a plain tensor equal to the worker's value, when one is kept

    @staticmethod
    def __new__(cls, session, vid: int, meta: TensorMeta, mid: int | None = None):
        shape, stride, dtype, offset = meta
        if offset:
            r = _wrapper(
                cls, shape, strides=stride, storage_offset=offset, dtype=dtype, device=_CPU
            )
        else:  # the common case: each keyword passed is parsed, at a cost
            r = _wrapper(cls, shape, strides=stride, dtype=dtype, device=_CPU)
        r._gt_id = vid
        r._gt_s = session
        r._gt_m = meta
        r._gt_k = meta_id(meta) if mid is None else mid
        return r

    def __del__(self):
        s = self.__dict__.get("_gt_s")
        if s is not None and not s.closed:
            s.freed.append(self._gt_id)  # joins the stream before the next instruction
            s.counters["frees"] += 1

    # -- sync points that do not pass through the dispatcher ------------------------------
    def cpu(self, memory_format=torch.preserve_format) -> torch.Tensor:  # noqa: ARG002
        """The value as a plain CPU tensor (waits for the worker)."""
        s = self._gt_s
        s.check()
        return mark_fetched(s.fetch(self._gt_id))

    def numpy(self, *, force: bool = False):  # noqa: ARG002
        return self.cpu().numpy()

    def tolist(self):
        return self.cpu().tolist()

    def __array__(self, dtype=None, copy=None):  # noqa: ARG002
        a = self.cpu().numpy()
        return a if dtype is None else a.astype(dtype)

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(spec)
        return self.__repr__().__format__(spec)

    def __repr__(self, *, tensor_contents=None) -> str:  # noqa: ARG002
        s = self._gt_s
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
                    self._gt_become_plain(other)  # (client.tensor_io)
                    return
                other = upload(self._gt_s, other)
            fresh = torch.ops.aten.alias.default(other)
            rebind(self, fresh)


def rebind(p: Proxy, fresh: Proxy) -> None:
    """Make ``p`` refer to ``fresh``'s value and metadata (``fresh`` is consumed)."""
    torch._C.TensorBase.data.__set__(p, fresh)  # shallow-copies sizes/strides into p
    old = p._gt_id
    p._gt_id, p._gt_m, p._gt_k = fresh._gt_id, fresh._gt_m, fresh._gt_k
    p._gt_v = fresh._gt_v
    fresh.__dict__["_gt_s"] = None  # fresh's id now belongs to p
    s = p._gt_s
    if not s.closed:
        s.freed.append(old)


def is_remote(t) -> bool:
    """True when ``t`` is a gt worker tensor (its data lives in the worker)."""
    return isinstance(t, Proxy)


# -- uploads ------------------------------------------------------------------------------
_uploads: dict[int, tuple] = {}  # id(plain tensor) -> (weakref, version, session gen, proxy ref)


def upload(session, t: torch.Tensor, cache: bool = True) -> Proxy:
    """A proxy holding a copy of the plain tensor ``t`` (cached while ``t`` is unchanged)."""
    if t.device.type == "meta":
        raise UnsupportedOperation("a meta tensor has no data to send to the gt worker")
    if t.layout != torch.strided:
        raise UnsupportedOperation(
            f"a {t.layout} tensor cannot be sent to the gt worker: worker tensors are dense "
            "(strided) only. Use it outside gt_core.capture(), or send t.to_dense()."
        )
    key = id(t)
    hit = _uploads.get(key)
    if hit is not None:
        ref, version, gen, pref = hit
        p = pref()
        if ref() is t and version == t._version and gen == session.gen and p is not None:
            return p
    vid = session.new_ids(1)[0]
    session.matcher.lines.count("uploads", session.counters)
    with torch._C._DisableTorchDispatch():
        data = t.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        if data.dim() == 0 and not data.is_complex():
            # A scalar travels as an op with its value in the arguments: no upload barrier
            # cuts the block (Adam's foreach step adds torch.tensor(1.0) every step), and a
            # value that changes is lifted into an input of the compiled block like any float.
            data = data.clone()  # its shadow: must not change when the user's tensor does
            idx = session.op(_SCALAR_TENSOR)
            session.emit(Op(OP, idx, (data.item(),), {"dtype": data.dtype, "device": _CPU}, (vid,)))
            p = Proxy(session, vid, tensor_meta(data))
            p._gt_v = data
        else:
            # The copy the worker gets is taken now (the user may change t before it is
            # sent), laid out as clone() lays it out, lazy conjugate and negative bits applied.
            stride, _ = layout(data)
            session.emit(Put(PUT, vid, session.stage(data)))
            p = Proxy(session, vid, TensorMeta(tuple(data.shape), stride, data.dtype, 0))
            if session.tee_puts is not None:  # a jit call records: it may be a constant
                keep = data.clone() if data.numel() <= CONSTANT_NUMEL else None
                session.tee_puts.append((vid, p, keep, user_line()))
    if not cache:
        return p
    try:
        _uploads[key] = (
            weakref.ref(t, lambda _r, k=key, d=_uploads: d.pop(k, None)),  # (d: at exit too)
            t._version,
            session.gen,
            weakref.ref(p),
        )
    except TypeError:
        pass
    return p


# A tensor a jitted step makes from host data is frozen into its block when equal on the
# recorded calls; one larger than this is data, never frozen (pass it as an argument).
CONSTANT_NUMEL = 1 << 16
_SCALAR_TENSOR = torch.ops.aten.scalar_tensor.default
_CPU = torch.device("cpu")


_fetched: dict[int, weakref.ref] = {}  # id(plain tensor) -> weakref: values fetched from a proxy


def mark_fetched(t: torch.Tensor) -> torch.Tensor:
    """Remember that ``t`` is a value fetched from the worker (a move to the CPU)."""
    key = id(t)
    _fetched[key] = weakref.ref(t, lambda _r, k=key: _fetched.pop(k, None))
    return t


def is_fetched(t: torch.Tensor) -> bool:
    ref = _fetched.get(id(t))
    return ref is not None and ref() is t
