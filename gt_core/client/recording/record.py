"""Recording: every aten op on proxies becomes one OP instruction, its outputs new proxies.

The proxy class's ``__torch_dispatch__`` (``gt_core.client.recording.proxy``) calls ``record`` with
itself as ``cls``: the proxies met and made here are of that class, which this module never
imports (the class imports this module to dispatch to it).

The steady state's common case is inline in ``record`` (the metadata cache hit, one new
tensor or an input returned); inside a hot block's occurrence, ``follow`` binds the op from
the plan first. Everything else (first sights, uploads, shadows, ops that need real data)
goes through ``_record``; there an op with an explicit ``torch.Generator`` runs in the
kernel instead (``generators``).
"""

from __future__ import annotations

import torch

from gt_core.client.interrupt import user_line
from gt_core.client.plans.follow import Learned, follow, varying
from gt_core.client.recording.generators import has_generator, run_here, takes_generator
from gt_core.client.recording.meta import (
    ANY_FLOAT,
    SCALARS,
    SYNC_OP,
    Alias,
    Const,
    New,
    floats_free,
    infer,
    meta_cache,
    scalar_result,
)
from gt_core.client.recording.proxy_fields import set_meta
from gt_core.client.recording.shadows import read_shadows, update_shadows
from gt_core.client.recording.uploads import rebind, upload
from gt_core.client.session import live_session
from gt_core.errors import UnsupportedOperation, WorkerLost
from gt_core.stream.instructions import OP, Op, Ref, new
from gt_core.stream.meta import Made, TensorMeta
from gt_core.stream.requests import Call

__all__ = ["record", "in_forked_child"]


def _current_session():
    s = live_session()
    s.check()  # a factory op for a dead worker fails now, not at some later flush
    return s


class _Walk:
    """One op's arguments: their cache key, the form sent (with Refs), the proxies met.

    A class, not a closure: a recursive closure is a reference cycle that would keep the
    argument proxies alive until the garbage collector runs, and delay their frees.
    """

    __slots__ = ("cls", "func", "session", "proxies", "plain", "floats_free")

    def __init__(self, cls, func):
        self.cls = cls  # the proxy class
        self.func = func
        self.floats_free = floats_free(func)
        self.session = None
        self.proxies: list = []
        self.plain: dict[int, torch.Tensor] = {}  # index in proxies -> plain tensor uploaded there

    def walk(self, a):
        """-> (cache key part, the argument as sent).

        A tensor's key part is its metadata id (an int); a constant's is (type, value), so
        1, 1.0 and True stay apart and never collide with a metadata id.
        """
        t = type(a)
        if t is self.cls and a.gt_session is self.session:  # the common case, first
            self.proxies.append(a)
            return a.gt_meta_key, Ref(a.gt_value_id)
        if t is float and self.floats_free:
            return ANY_FLOAT, a
        if t is int or t is float or t is bool or a is None:
            return (t, a), a
        if isinstance(a, torch.Tensor):
            if not isinstance(a, self.cls):
                if self.session is None:
                    self.session = _current_session()
                self.plain[len(self.proxies)] = a
                a = upload(self.cls, self.session, a)
            s = a.gt_session
            if s.dead is not None and not s.closed:  # died, not yet restarted
                s.check()  # raises WorkerDied with the cause
            if s is not self.session:
                if s.closed:
                    raise WorkerLost(
                        f"{self.func}: a worker tensor {list(a.shape)} belongs to a gt worker that was "
                        "stopped or restarted; its value is gone. Re-run the code that creates it."
                    )
                if self.session is not None:
                    raise WorkerLost(
                        f"{self.func}: tensors from two gt worker generations were mixed; re-create the older ones"
                    )
                self.session = s
            self.proxies.append(a)
            return a.gt_meta_key, Ref(a.gt_value_id)
        if t is list or t is tuple:
            parts = [self.walk(x) for x in a]
            return (t, tuple(k for k, _ in parts)), t(x for _, x in parts)
        return (t, a), a


def record(cls, func, args, kwargs):
    """Record ``func(*args, **kwargs)`` as an instruction and return proxies (of class
    ``cls``) for its outputs."""
    # Inside a hot block's occurrence: the op the plan expects next, checked against what
    # recording it found before, bound without building an instruction (see follow).
    if args:
        a = args[0]
        if type(a) is cls:
            s = a.gt_session
            if s.matcher.cands and not s.closed and s.dead is None:
                if s.freed:
                    s.drain_frees()  # they come first, as emit would put them
                if len(s.matcher.cands) == 1:
                    out = follow(cls, s, func, args, kwargs)
                    if out is not None:
                        return out
    # The steady state's common case, inline: proxies, scalars, int lists and scalar keyword
    # arguments. The key is built exactly as _record builds it, so both share cache entries.
    session = None
    key = [func]
    sent = []
    proxies = []
    for a in args:
        t = type(a)
        if t is cls:
            if a.gt_shadow is not None:
                break  # shadowed: the slow path keeps the shadow up to date
            s = a.gt_session
            if s is not session:
                if session is not None or s.closed or s.dead is not None:
                    break
                session = s
            proxies.append(a)
            key.append(a.gt_meta_key)
            sent.append(Ref(a.gt_value_id))
        elif t in SCALARS:
            key.append(ANY_FLOAT if t is float and floats_free(func) else (t, a))
            sent.append(a)
        elif (t is list or t is tuple) and all(type(x) is int for x in a):
            key.append((t, tuple([(int, x) for x in a])))
            sent.append(a)
        else:
            break
    else:
        for k, v in kwargs.items():
            tv = type(v)
            if tv not in SCALARS:
                session = None
                break
            key.append((k, ANY_FLOAT if tv is float and floats_free(func) else (tv, v)))
        if session is not None:
            entry = meta_cache.get(tuple(key))
            if entry is not None and entry is not SYNC_OP:
                t = entry.template
                kind = type(t)
                if kind is New or (kind is Alias and t.after is None):
                    return _inline(cls, session, func, t, sent, args, kwargs, proxies)
    return _record(cls, func, args, kwargs)


def _inline(cls, session, func, t, sent, args, kwargs, proxies):
    """An op whose cache entry's template ``t`` is one new tensor out, or an input returned
    unchanged (in place), the two most common op shapes of all: emitted as built inline."""
    session.counters["ops"] += 1
    idx = session.op_index.get(func)
    if idx is None:
        idx = session.op(func)
    if type(t) is New:
        vid = next(session.ids)
        outs = (vid,)
    else:
        outs = (None,)
    if session.freed:
        session.drain_frees()  # first, so the position below is this op's
    cands = session.matcher.cands
    c = cands[0] if len(cands) == 1 else None
    pos = c.pos if c is not None else -1
    session.emit(new(Op, (OP, idx, tuple(sent), kwargs, outs)), proxies)
    if c is not None and c.pos == pos + 1:
        # matched as the plan's entry pos: what the next occurrences reuse
        want = varying(cls, c.entries[pos], args, kwargs, func)
        c.learn(pos, Learned(func, want, t, len(proxies)))
    return cls(session, vid, t.meta, t.mid) if type(t) is New else proxies[t.index]


_SET_STORAGE = (
    torch.ops.aten.set_.source_Storage,
    torch.ops.aten.set_.source_Storage_storage_offset,
)


def _record(cls, func, args, kwargs):
    if func in _SET_STORAGE and isinstance(args[1], torch.UntypedStorage):
        return set_host_storage(cls, func, args, kwargs)  # torch.load builds tensors this way
    if takes_generator(func) and has_generator(args, kwargs):
        # the user's generator draws here, as in eager
        return run_here(cls, func, args, kwargs, record)
    w = _Walk(cls, func)
    walk = w.walk
    pa = [walk(a) for a in args]
    session, proxies, plain = w.session, w.proxies, w.plain
    if kwargs:
        pk = {k: walk(v) for k, v in kwargs.items()}
        session = w.session
        key = (func, *[k for k, _ in pa], *[(name, k) for name, (k, _) in pk.items()])
        sent_kwargs = {name: x for name, (_, x) in pk.items()}
    else:
        key = (func, *[k for k, _ in pa])
        sent_kwargs = {}
    if session is None:  # a factory op (no tensor arguments) inside capture
        session = _current_session()
    sent_args = tuple([x for _, x in pa])
    try:
        entry = meta_cache.get(key)
    except TypeError:  # an unhashable argument: infer every time
        key, entry = None, None
    if entry is None:
        entry = infer(cls, func, args, kwargs)
        if key is not None:
            meta_cache[key] = entry
        where = user_line()  # a first sight: worth the frame walk (errors name the line)
    else:
        where = None
    shadowed = any(p.gt_shadow is not None for p in proxies)
    if entry is SYNC_OP:
        if shadowed and all(p.gt_shadow is not None for p in proxies) and scalar_result(func):
            return read_shadows(cls, session, func, args, kwargs)  # (no round trip)
        return _run_now(cls, session, func, sent_args, sent_kwargs, proxies)
    template, n_new, mask = entry
    idx = session.op(func)
    ids = session.new_ids(n_new) if n_new else ()
    if len(mask) == n_new:
        outs = tuple(ids)
    else:  # some outputs are inputs (in place): the worker binds only the new ones
        it = iter(ids)
        outs = tuple(next(it) if new else None for new in mask)
    session.counters["ops"] += 1
    session.emit(new(Op, (OP, idx, sent_args, sent_kwargs, outs)), proxies)
    if where is not None and ids:
        session.site(ids[0], where)
    out = _build(cls, template, session, iter(ids), proxies)
    if shadowed:
        update_shadows(cls, session, func, args, kwargs, out, proxies)
    if plain and type(template) is Alias and template.index in plain and func._schema.is_mutable:
        # In place on a plain tensor with a worker argument: bring the result home.
        target = plain[template.index]
        with torch._C._DisableTorchDispatch():
            target.copy_(out.cpu())
        return target
    return out


def _build(cls, template, session, ids, proxies):
    kind = type(template)
    if kind is New:
        return cls(session, next(ids), template.meta, template.mid)
    if kind is Alias:
        p = proxies[template.index]
        after = template.after
        if after is not None and after != p.gt_meta:  # in-place op changed metadata
            _restride(p, after)
        return p
    if kind is Const:
        return template.value
    return template.kind(_build(cls, t, session, ids, proxies) for t in template.items)


def _restride(p, meta: TensorMeta) -> None:
    shape, stride, _, offset = meta
    with torch._C._DisableTorchDispatch():
        storage = p.untyped_storage()
        need = _span(shape, stride, offset) * p.element_size()
        if need > storage.nbytes():  # (an out= tensor the op resized, such as torch.empty(0))
            storage.resize_(need)
        torch._C.TensorBase.as_strided_(p, shape, stride, offset)
    set_meta(p, meta)


def _span(shape, stride, offset: int) -> int:
    """Elements of storage a layout reaches (0 for an empty tensor)."""
    if any(n == 0 for n in shape):
        return 0
    return offset + 1 + sum((n - 1) * st for n, st in zip(shape, stride, strict=True))


def _run_now(cls, session, func, args, kwargs, proxies):
    """Flush and run ``func`` on the worker now; its outputs come back described."""
    idx = session.op(func)
    session.counters["ops"] += 1
    base = session.next_id
    described, end = session.request(Call(idx, args, kwargs, base))
    session.ids_from(end)
    if type(described) in (int, float, bool, complex) and proxies:  # .item(): a value fetched
        session.counters["fetches"] += 1
        session.counters["bytes_down"] += proxies[0].element_size()
    return _described(cls, described, session, {p.gt_value_id: p for p in proxies})


def _described(cls, d, session, by_id):
    """Proxies for the worker's description of a sync op's outputs."""
    if type(d) is Ref:
        return by_id[d.id]
    if type(d) is Made:
        return cls(session, d.vid, d.meta)
    if type(d) in (list, tuple):
        return type(d)(_described(cls, x, session, by_id) for x in d)
    return d


def set_host_storage(cls, func, args, kwargs):
    """``p.set_(storage, ...)`` with a plain CPU storage: ``p`` takes that data, uploaded."""
    p = args[0]
    with torch._C._DisableTorchDispatch():
        plain = torch.empty(0, dtype=p.dtype)
        func(plain, *args[1:], **kwargs)
    rebind(p, upload(cls, p.gt_session, plain, cache=False))
    return p


def in_forked_child(cls, func, args, kwargs):
    """An op in a fork of the kernel (a DataLoader's worker process): run plainly; a worker
    tensor (of class ``cls``) cannot be used there (its worker answers the kernel alone)."""
    if _has_proxy(cls, (*args, *kwargs.values())):
        raise UnsupportedOperation(
            f"{func}: a gt worker tensor was used in a forked process (a DataLoader worker "
            "process with num_workers > 0?). Its value lives on the kernel's gt worker, which "
            "only the kernel can reach. Give the DataLoader host tensors (made outside the "
            "capture, or fetched with .cpu()), or use num_workers=0 to index worker tensors."
        )
    return func(*args, **kwargs)


def _has_proxy(cls, xs) -> bool:
    """Whether a worker tensor is among ``xs`` (or in a list or tuple there)."""
    for x in xs:
        if isinstance(x, cls) or (type(x) in (list, tuple) and _has_proxy(cls, x)):
            return True
    return False
