"""Tensor metadata, in one field order: shape, stride, dtype, then what each side adds.

The client knows a worker value by its :class:`TensorMeta` (what a proxy is made from: the
storage offset too, no device, as every proxy is a CPU wrapper whatever the worker's device);
the worker's hot path knows it by its :class:`ValueMeta` (the device too, no storage offset),
what a block's signature guards for each of its inputs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "TensorMeta",
    "ValueMeta",
    "Made",
    "tensor_meta",
    "value_meta",
    "addressed",
    "strides_fit",
    "fits",
    "all_fit",
]


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


# "Is this value the block's input?" has one answer, here, for the client's plans and the
# worker's blocks alike: the same shape, dtype (and device, where both sides know it), and
# the same stride on every dimension that holds more than one element. A one-element
# dimension's stride addresses nothing: inductor's own check of a compiled graph's inputs
# skips it, and the client's inference of it may differ from the worker's tensor.


def addressed(shape, stride) -> tuple:
    """``stride`` as far as it addresses elements: None for each one-element dimension."""
    return tuple(s if n != 1 else None for n, s in zip(shape, stride, strict=True))


def strides_fit(shape, stride, want) -> bool:
    """Whether strides ``stride`` and ``want`` of a value of ``shape`` address the same
    elements (they agree on every dimension of more than one element)."""
    if stride == want:
        return True
    return len(stride) == len(want) == len(shape) and addressed(shape, stride) == addressed(
        shape, want
    )


def fits(meta, want) -> bool:
    """Whether a value of metadata ``meta`` fits an input of metadata ``want`` (TensorMeta
    or ValueMeta, or their first three fields: shape, stride, dtype; the device is compared
    where both are ValueMeta)."""
    if meta[0] != want[0] or meta[2] != want[2]:
        return False
    if isinstance(meta, ValueMeta) and isinstance(want, ValueMeta) and meta[3] != want[3]:
        return False
    return strides_fit(meta[0], meta[1], want[1])


def all_fit(values: dict, ids, metas) -> bool:
    """Whether ``values[i]`` exists and fits ValueMeta ``m`` (see fits) for each id ``i`` and
    ``m`` in order (a RUN's inputs against its block, once per replayed call: the fields are
    compared in place, no ValueMeta built per value)."""
    for vid, (shape, stride, dtype, device) in zip(ids, metas, strict=True):
        t = values.get(vid)
        if t is None or t.shape != shape or t.dtype != dtype or t.device != device:
            return False
        have = t.stride()
        if have != stride and not strides_fit(shape, have, stride):
            return False
    return True
