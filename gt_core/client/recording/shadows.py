"""Shadows of small values: plain copies of worker values, kept equal to them here.

Small tensors uploaded from the client (0-d ones: optimizer step counters,
``torch.tensor(1.0)``) carry a shadow in ``gt_core.Proxy.gt_shadow`` (set and dropped through
``proxy_fields``), kept up to date by running here as well the ops made only of shadowed
tensors. ``.item()`` of a shadowed proxy then answers without a round trip: Adam's bias
corrections do not sync every step.
"""

from __future__ import annotations

import torch

from gt_core.client.recording.proxy_fields import drop_shadow, set_shadow

_SHADOW_MAX = 64  # elements: a new (non-view) result larger than this keeps no shadow


def _plain(a, cls):
    """Arguments with shadowed proxies (of class ``cls``) replaced by their shadows."""
    if isinstance(a, cls):
        return a.gt_shadow
    if type(a) in (list, tuple):
        return type(a)(_plain(x, cls) for x in a)
    return a


def on_shadows(cls, func, args, kwargs):
    """``func`` run here on the shadows of its proxies (of class ``cls``)."""
    with torch._C._DisableTorchDispatch():
        return func(*_plain(args, cls), **{k: _plain(v, cls) for k, v in kwargs.items()})


def read_shadows(cls, session, func, args, kwargs):
    """A number ``func`` reads (``.item()``), answered from the shadows: while a jitted call
    records, its log keeps where it came from (jit.program)."""
    session.counters["shadow_reads"] += 1
    value = on_shadows(cls, func, args, kwargs)
    log = session.shadow_log
    return value if log is None else log.read(func, args, kwargs, value)


def update_shadows(cls, session, func, args, kwargs, out, proxies) -> None:
    """Keep shadows equal to the worker's values after ``func`` was recorded on ``proxies``
    (of class ``cls``)."""
    if (
        all(p.gt_shadow is not None for p in proxies)
        and torch.Tag.nondeterministic_seeded not in func.tags
    ):
        try:
            res, ok = on_shadows(cls, func, args, kwargs), True
        except Exception:
            res, ok = None, False
        log = session.shadow_log  # (a jitted call recording: jit.program)
        if ok:
            storages = {p.gt_shadow.untyped_storage().data_ptr() for p in proxies}
            _bind_shadows(cls, out, res, storages)
            if log is not None:
                log.op(func, args, kwargs, out)
            return
        for p in proxies:  # could not follow: these values are asked of the worker from now on
            drop_shadow(p)
        if log is not None:
            log.lost(f"{func} could not follow its shadows")
        return
    if func._schema.is_mutable:
        # A shadowed value written with unshadowed inputs: refresh it from the worker (the
        # copy goes into the shadow's storage, so views sharing it follow). Only what the op
        # writes: a shadowed input it only reads (`param.mul_(1 - lr * wd)`) stays as it is.
        for p in written_args(func, args, kwargs):
            if type(p) is cls and p.gt_shadow is not None:
                if session.shadow_log is not None:
                    session.shadow_log.lost(f"a shadow {func} wrote was refreshed from the worker")
                fresh = session.fetch(p.gt_value_id)
                with torch._C._DisableTorchDispatch():
                    p.gt_shadow.copy_(fresh)


def written_args(func, args, kwargs) -> list:
    """The arguments ``func`` writes in place (tensors, or items of tensor lists)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        out.extend(v if type(v) in (list, tuple) else [v])
    return out


def _bind_shadows(cls, out, res, storages) -> None:
    if isinstance(out, cls):
        if isinstance(res, torch.Tensor) and (
            res.numel() <= _SHADOW_MAX or res.untyped_storage().data_ptr() in storages
        ):
            set_shadow(out, res)
    elif type(out) in (list, tuple) and type(res) in (list, tuple) and len(out) == len(res):
        for o, r in zip(out, res, strict=True):
            _bind_shadows(cls, o, r, storages)
