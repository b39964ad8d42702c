"""A proxy's fields: where its value lives on the worker, and the few functions that write them.

A proxy (``gt_core.client.recording.proxy.Proxy``) holds, besides what torch keeps for any
tensor, five fields:

  ``gt_value_id``  the id of its value on the worker
  ``gt_session``   the session whose worker holds that value (None once another proxy took it)
  ``gt_meta``      its metadata (``TensorMeta``: shape, stride, dtype, storage offset)
  ``gt_meta_key``  ``meta_id(gt_meta)``, the small int cache keys hold for it
  ``gt_shadow``    a plain tensor equal to the worker's value, kept here (``shadows``), or None

They are public, read as plain attributes by the client's modules (a read is on the per-op
path), and named with a ``gt_`` prefix so that none can take the name of one of
torch.Tensor's own attributes. Only this module writes them, through the functions below: a
new proxy's (``make``), its shadow (``set_shadow``, ``drop_shadow``), its metadata after an
in-place op (``set_meta``) and another proxy's value taken over (``take_value``). It imports
no module that makes or records proxies, so every one of them can import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gt_core.client.recording.meta import meta_id

if TYPE_CHECKING:
    import torch

    from gt_core.stream.meta import TensorMeta

__all__ = [
    "FIELDS",
    "ProxyFields",
    "make",
    "set_shadow",
    "drop_shadow",
    "set_meta",
    "take_value",
]

FIELDS = ("gt_value_id", "gt_session", "gt_meta", "gt_meta_key", "gt_shadow")


class ProxyFields:
    """The fields a proxy holds (a base of Proxy); a proxy keeps no shadow until given one."""

    __slots__ = ()
    gt_value_id: int
    gt_session: object  # gt_core.client.session.Session, or None
    gt_meta: TensorMeta
    gt_meta_key: int
    gt_shadow: torch.Tensor | None = None


def make(p, session, vid: int, meta: TensorMeta, mid: int | None) -> None:
    """The fields of the new proxy ``p``: value ``vid`` of ``session``, metadata ``meta``
    (``mid`` its key, computed when None)."""
    p.gt_value_id = vid
    p.gt_session = session
    p.gt_meta = meta
    p.gt_meta_key = meta_id(meta) if mid is None else mid


def set_shadow(p, shadow: torch.Tensor) -> None:
    """``p`` keeps ``shadow``, a plain tensor equal to its worker value (``shadows``)."""
    p.gt_shadow = shadow


def drop_shadow(p) -> None:
    """``p`` keeps no shadow: its value is asked of the worker from now on."""
    p.gt_shadow = None


def set_meta(p, meta: TensorMeta) -> None:
    """``p``'s metadata is ``meta`` now (an in-place op changed its layout)."""
    p.gt_meta, p.gt_meta_key = meta, meta_id(meta)


def take_value(p, fresh) -> int:
    """``p`` refers to the proxy ``fresh``'s value, metadata and shadow from now on, and
    ``fresh`` to no session (freeing it must not free the value, p's now); the id ``p`` held
    before, for the caller to free."""
    old = p.gt_value_id
    p.gt_value_id, p.gt_meta, p.gt_meta_key = fresh.gt_value_id, fresh.gt_meta, fresh.gt_meta_key
    p.gt_shadow = fresh.gt_shadow
    fresh.gt_session = None
    return old
