"""Uploads: plain tensors an op meets, sent to the worker once and cached while unchanged.

Proxies are made here without importing their class: the caller passes it (``cls``; the
proxy class's own dispatch passes itself, see ``proxy``). A 0-d upload carries a shadow, a
plain copy of its value (see ``shadows``).
"""

from __future__ import annotations

import sys
import weakref

import torch

from gt_core.client.interrupt import user_line
from gt_core.client.recording.proxy_fields import set_shadow, take_value
from gt_core.diagnostics.torch_hooks import in_backward
from gt_core.errors import UnsupportedOperation
from gt_core.stream.instructions import OP, PUT, Op, Put
from gt_core.stream.meta import TensorMeta, tensor_meta
from gt_core.stream.staging import layout

__all__ = ["upload", "batch", "rebind", "CONSTANT_NUMEL"]

# A tensor a jitted step makes from host data is frozen into its block when equal on the
# recorded calls; one larger than this is data, never frozen (pass it as an argument).
CONSTANT_NUMEL = 1 << 16
_SCALAR_TENSOR = torch.ops.aten.scalar_tensor.default
_CPU = torch.device("cpu")

# id(plain tensor) -> (weakref to it, its version, session gen, its proxy). A tensor met again
# while its proxy lives is not sent again. The proxy is held while the tensor lives: autograd
# saves the plain batch an op met and the backward reads it again (and ``x.t()`` of it, the
# same view of the worker's copy), where a second upload would cut every step's block in two.
# For a backward only: a forward op meeting a tensor whose proxy nothing but this holds
# uploads it again, since a host tensor the user keeps may have been written behind torch's
# version counter meanwhile (a numpy buffer refilled each step), and eager reads it as it is
# now. While a jit call records, the proxy is held weakly: a value the call makes that
# outlives it is one jit would have to put back, and a replayed call uploads again. (A
# saved_tensors_hooks pair would say exactly which tensors a graph holds, but returning a
# saved output from its pack hook ties the output to its graph in a cycle that only the
# garbage collector frees: frees would land anywhere.)
_uploads: dict[int, tuple] = {}

# id(plain tensor) -> the weakrefs of the tensors of its DataLoader batch (see batch).
_batches: dict[int, list] = {}


def batch(tensors: list) -> None:
    """``tensors`` (plain host tensors) came out of a DataLoader as one batch: the first of
    them an op uploads takes the others up with it, each served once to the first op that
    meets it. A step's uploads then stand together at its start, and the step is one block:
    its target's upload, met only at the loss, cut the forward off the rest (uploads are
    barriers: gt_core.hotpath.detector), and the forward ran eagerly every step. Each copy is
    taken as the first of them goes up, so a batch tensor the user writes behind torch's
    version counter in between (through numpy) is read as it was then."""
    if len(tensors) < 2:
        return
    group: list = []
    for t in tensors:
        key = id(t)

        def gone(_r, k=key, g=group, d=_batches):
            if d.get(k) is g:
                del d[k]

        try:
            group.append(weakref.ref(t, gone))
        except TypeError:
            continue
        _batches[key] = group


def _cached(session, t: torch.Tensor):
    """The proxy of ``t``'s upload while ``t`` is unchanged since (None: there is none)."""
    hit = _uploads.get(id(t))
    if hit is None:
        return None
    ref, version, gen, p, fresh = hit
    if type(p) is weakref.ref:
        p = p()
    elif sys.getrefcount(p) <= 3 and not in_backward():
        if not fresh:  # (its holders: the entry, this frame, getrefcount's argument)
            return None
        _uploads[id(t)] = (ref, version, gen, p, False)  # (taken up with its batch: once)
    if p is None or ref() is not t or version != t._version or gen != session.gen:
        return None
    return p


def _view_of_upload(session, t: torch.Tensor):
    """A view of an uploaded host tensor, as the same view of the worker's copy (no bytes):
    the copy is laid out as the host tensor (dense), from its first element on."""
    b = t._base
    if t.dtype != b.dtype or (t.is_conj(), t.is_neg()) != (b.is_conj(), b.is_neg()):
        return None
    p = _cached(session, b)
    if p is None or p.gt_shadow is not None or p.gt_meta.stride != b.stride() or not t.numel():
        return None
    offset = t.storage_offset() - b.storage_offset()
    last = offset + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    if offset < 0 or last >= b.numel() or min(t.stride(), default=0) < 0:
        return None
    return torch.ops.aten.as_strided.default(p, t.shape, t.stride(), offset)


def upload(cls, session, t: torch.Tensor, cache: bool = True):
    """A proxy (of class ``cls``) holding a copy of the plain tensor ``t`` (cached while
    ``t`` is unchanged)."""
    if t.device.type == "meta":
        raise UnsupportedOperation("a meta tensor has no data to send to the gt worker")
    if t.layout != torch.strided:
        raise UnsupportedOperation(
            f"a {t.layout} tensor cannot be sent to the gt worker: worker tensors are dense "
            "(strided) only. Use it outside gt_core.capture(), or send t.to_dense()."
        )
    key = id(t)
    if cache:
        p = _cached(session, t)
        if p is None and t._base is not None:
            p = _view_of_upload(session, t)
        if p is not None:
            return p
    p = _send(cls, session, t)
    if not cache:
        return p
    _keep(session, t, p, fresh=False)
    group = _batches.pop(key, None)
    if session.tee_puts is not None:  # (a jit call's batch goes up with its RUN anyway)
        return p
    for ref in group or ():  # (the rest of its batch, sent beside it)
        other = ref()
        if other is not None and _batches.pop(id(other), None) is group:
            _keep(session, other, _send(cls, session, other), fresh=True)
    return p


def _keep(session, t: torch.Tensor, p, fresh: bool) -> None:
    """Cache ``p`` as the upload of ``t`` (``fresh``: served once whoever holds it)."""
    key = id(t)
    try:
        _uploads[key] = (
            weakref.ref(t, lambda _r, k=key, d=_uploads: d.pop(k, None)),  # (d: at exit too)
            t._version,
            session.gen,
            p if session.tee_puts is None else weakref.ref(p),
            fresh,
        )
    except TypeError:
        pass


def _send(cls, session, t: torch.Tensor):
    """A new proxy of class ``cls`` for a copy of ``t``, its value in the stream."""
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
            p = cls(session, vid, tensor_meta(data))
            set_shadow(p, data)
            return p
        # The copy the worker gets is taken now (the user may change t before it is sent),
        # laid out as clone() lays it out, lazy conjugate and negative bits applied.
        stride, _ = layout(data)
        session.emit(Put(PUT, vid, session.stage(data)))
        p = cls(session, vid, TensorMeta(tuple(data.shape), stride, data.dtype, 0))
        if session.tee_puts is not None:  # a jit call records: it may be a constant
            keep = data.clone() if data.numel() <= CONSTANT_NUMEL else None
            session.tee_puts.append((vid, p, keep, user_line()))
    return p


def rebind(p, fresh) -> None:
    """Make the proxy ``p`` refer to the proxy ``fresh``'s value and metadata (``fresh`` is
    consumed)."""
    torch._C.TensorBase.data.__set__(p, fresh)  # shallow-copies sizes/strides into p
    old = take_value(p, fresh)
    s = p.gt_session
    if not s.closed:
        s.freed.append(old)
