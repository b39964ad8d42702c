"""Tensor metadata, in one field order: shape, stride, dtype, then what each side adds.

The client knows a worker value by its :class:`TensorMeta` (what a proxy is made from: the
storage offset too, no device, as every proxy is a CPU wrapper whatever the worker's device);
the worker's hot path knows it by its :class:`ValueMeta` (the device too, no storage offset),
what a block's signature guards for each of its inputs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["TensorMeta", "ValueMeta", "Made", "tensor_meta", "value_meta", "all_fit"]


class TensorMeta(NamedTuple):
    """What the client needs to make a proxy of a worker value."""

    shape: tuple
    stride: tuple
    dtype: Any  # torch.dtype
    offset: int  # the storage offset


class ValueMeta(NamedTuple):
    """A worker value's metadata as a block's signature guards it."""

    shape: tuple
    stride: tuple
    dtype: Any  # torch.dtype
    device: Any  # torch.device


class Made(NamedTuple):
    """A new value an op run at once on the worker made (in its answer to the client)."""

    vid: int
    meta: TensorMeta


def tensor_meta(t) -> TensorMeta:
    """The TensorMeta of tensor ``t``."""
    return TensorMeta(tuple(t.shape), t.stride(), t.dtype, t.storage_offset())


def value_meta(t) -> ValueMeta:
    """The ValueMeta of tensor ``t``."""
    return ValueMeta(tuple(t.shape), t.stride(), t.dtype, t.device)


def all_fit(values: dict, ids, metas) -> bool:
    """Whether ``values[i]`` exists with ValueMeta ``m`` for each id ``i`` and ``m`` in order
    (a RUN's inputs against its block, once per replayed call: the fields are compared in
    place, no ValueMeta built per value)."""
    for vid, (shape, stride, dtype, device) in zip(ids, metas, strict=True):
        t = values.get(vid)
        if (
            t is None
            or t.shape != shape
            or t.stride() != stride
            or t.dtype != dtype
            or t.device != device
        ):
            return False
    return True
