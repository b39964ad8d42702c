"""The metadata cache and meta inference: what an op's outputs look like, without its data.

An op's result metadata comes from running it on meta tensors once per (op, argument
metadata, non-tensor arguments) and is cached, so the steady state records an op without
any inference. Ops that need real data (a Python scalar result, or a shape that depends on
values) are marked ``SYNC_OP``: they flush the stream and run on the worker at once.

A cache entry is an :class:`Entry`: how to build the result (a template of :class:`New`
proxies, inputs returned as :class:`Alias`, :class:`Const` values, :class:`Nested` lists and
tuples of these), how many new values it makes, and which outputs are new.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from gt_core.errors import UnsupportedOperation
from gt_core.stream.meta import TensorMeta, tensor_meta

meta_cache: dict = {}
_meta_ids: dict[TensorMeta, int] = {}
_cache_dtype = [torch.get_default_dtype()]


def follow_default_dtype(d: torch.dtype) -> None:
    """The cache's entries hold the default dtype they were inferred under (a factory without
    a dtype, an integer tensor with a Python float take it): another one, ``d``, empties it."""
    if d != _cache_dtype[0]:
        meta_cache.clear()
        _cache_dtype[0] = d


def meta_id(meta: TensorMeta) -> int:
    """A small int per distinct metadata: what cache keys hold for a tensor (cheap to hash)."""
    mid = _meta_ids.get(meta)
    if mid is None:
        mid = _meta_ids[meta] = len(_meta_ids)
    return mid


def where_free_key(p) -> int:
    """The metadata id of proxy ``p`` wherever its storage begins (storage offset 0): what a
    jitted function's key holds for an argument, so that views of one tensor at successive
    offsets (batches sliced from a stream) are one key (see ``gt_core.client.jit.recording``:
    a block whose results would follow the offset is not replayed at another)."""
    meta = p.gt_meta
    return meta_id(meta._replace(offset=0)) if meta.offset else p.gt_meta_key


SYNC_OP = object()  # cache marker: this op runs on the worker at once


class New(NamedTuple):
    """A new worker value: a proxy of ``meta`` (``mid`` its metadata id)."""

    meta: TensorMeta
    mid: int


class Alias(NamedTuple):
    """The op's ``index``-th tensor argument, returned (in place); ``after`` its metadata
    where the op changed it (None: unchanged)."""

    index: int
    after: TensorMeta | None


class Nested(NamedTuple):
    """A list or tuple (``kind``) of templates."""

    kind: type
    items: tuple


class Const(NamedTuple):
    """A value that is not a tensor, the same for every call with this key."""

    value: Any


class Entry(NamedTuple):
    """A cache entry: the result's template, how many new values, which outputs are new."""

    template: New | Alias | Nested | Const
    n_new: int
    mask: tuple  # for each tensor output in order: True if new, False if an input


SCALARS = (int, float, bool, type(None))
ANY_FLOAT = (
    float,
    None,
)  # a float's cache key part where its value cannot change the result's metadata
_float_free: dict = {}


def floats_free(func) -> bool:
    """True when no float argument's value can change ``func``'s result metadata.

    Pointwise ops (shape from broadcasting, dtype from the float's type), foreach ops and
    scalar_tensor. Their cache key keeps a float's type, not its value: Adam's bias
    corrections and LR schedules change every step and would otherwise miss the cache (a
    meta inference each time) and grow it without bound.
    """
    r = _float_free.get(func)
    if r is None:
        r = _float_free[func] = (
            torch.Tag.pointwise in func.tags
            or func._opname.startswith("_foreach_")
            or func is torch.ops.aten.scalar_tensor.default
        )
    return r


def _to_meta(a, metas: list, cls):
    if isinstance(a, torch.Tensor):
        shape, stride, dtype, offset = a.gt_meta if isinstance(a, cls) else tensor_meta(a)
        m = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        if offset:
            # (an empty view needs no element past its offset: (s - 1) would go negative)
            size = offset
            if all(shape):
                size += sum((s - 1) * st for s, st in zip(shape, stride, strict=True)) + 1
            m = torch.empty(size, dtype=dtype, device="meta").as_strided(shape, stride, offset)
        metas.append(m)
        return m
    if type(a) in (list, tuple):
        return type(a)(_to_meta(x, metas, cls) for x in a)
    return a


def scalar_result(func) -> bool:
    return any(
        not isinstance(r.type, torch.TensorType) and "Tensor" not in str(r.type)
        for r in func._schema.returns
    )


def infer(cls, func, args, kwargs):
    """The output template of ``func`` from a meta run, or SYNC_OP if it needs real data
    (``cls``: the proxy class, whose instances carry their metadata)."""
    if scalar_result(func):
        return SYNC_OP  # a Python scalar or bool result: only the worker knows it
    metas: list = []
    margs = _to_meta(args, metas, cls)
    mkwargs = {k: _to_meta(v, metas, cls) for k, v in kwargs.items()}
    if any(a.name == "device" for a in func._schema.arguments):
        mkwargs["device"] = torch.device("meta")
    before = [tensor_meta(m) for m in metas]
    try:
        with torch._C._DisableTorchDispatch():
            out = func(*margs, **mkwargs)
    except Exception:
        # Only the real kernel knows: a data-dependent output shape (nonzero, unique, boolean
        # masks, indices read from a tensor as tensor_split's), a project's op without a fake
        # kernel, or a meta kernel stricter than the real one (circular padding of an empty
        # tensor). The worker runs it at once; a call that is wrong raises eager's own error.
        return SYNC_OP
    counter = [0]
    template = _template(out, metas, before, counter)
    return Entry(template, counter[0], tuple(_mask(template)))


def _mask(template):
    """For each tensor output in order: True if new, False if it is an input."""
    kind = type(template)
    if kind is New:
        yield True
    elif kind is Alias:
        yield False
    elif kind is Nested:
        for t in template.items:
            yield from _mask(t)


def _template(o, metas, before, counter):
    """How to build an op's result: new proxies, inputs returned (in place), constants."""
    if isinstance(o, torch.Tensor):
        if o.layout != torch.strided:
            raise UnsupportedOperation(
                f"gt: this op makes a {o.layout} tensor; worker tensors are dense (strided) "
                "only. Bring the input home first (t.cpu()): ops on plain tensors run in this "
                "process, inside capture too."
            )
        for i, m in enumerate(metas):
            if o is m:
                after = tensor_meta(m)
                return Alias(i, after if after != before[i] else None)
        counter[0] += 1
        meta = tensor_meta(o)
        return New(meta, meta_id(meta))
    if type(o) in (list, tuple):
        return Nested(type(o), tuple(_template(x, metas, before, counter) for x in o))
    return Const(o)
