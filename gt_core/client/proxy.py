"""Proxies: tensors whose data lives on the worker, and the recording of every aten op on them.

A proxy is a wrapper tensor subclass holding only metadata and a value id. Each aten op on a
proxy becomes one OP instruction; its result metadata comes from running the op on meta
tensors once per (op, argument metadata, non-tensor arguments) and is cached, so the steady
state records an op without any inference. Ops that need real data (a Python scalar result,
or a shape that depends on values) flush the stream and run on the worker at once.

Small tensors uploaded from the client (0-d ones: optimizer step counters, ``torch.tensor(1.0)``)
carry a shadow, a plain copy of their value kept up to date by running the ops made only of
shadowed tensors here as well. ``.item()`` of a shadowed proxy then answers without a round
trip: Adam's bias corrections no longer sync every step (see ``_shadow``).
"""

from __future__ import annotations

import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gt_core.client.interrupt import GT_DIR, LIBRARY_DIRS
from gt_core.client.interrupt import STATE as HELD
from gt_core.client.interrupt import check as check_interrupt
from gt_core.client.session import LOCK
from gt_core.errors import UnsupportedOperation, WorkerLost
from gt_core.stream.instructions import OP, PUT, Ref
from gt_core.stream.lift import Scalar
from gt_core.stream.plan import Slot

_OURS = (GT_DIR, *LIBRARY_DIRS)  # gt's, torch's and the standard library's files

__all__ = ["Proxy", "record", "CaptureMode", "upload", "is_remote"]

_meta_cache: dict = {}
_SYNC = object()  # cache marker: this op runs on the worker at once
_NEW, _ALIAS = 0, 1


def _meta_of(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)


_meta_ids: dict[tuple, int] = {}


def _meta_id(meta: tuple) -> int:
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
    def __new__(cls, session, vid: int, meta: tuple, mid: int | None = None):
        shape, stride, offset, dtype = meta
        if offset:
            r = _wrapper(cls, shape, strides=stride, storage_offset=offset, dtype=dtype, device=_CPU)
        else:  # the common case: each keyword parsed costs (about 0.1 µs each here)
            r = _wrapper(cls, shape, strides=stride, dtype=dtype, device=_CPU)
        r._gt_id = vid
        r._gt_s = session
        r._gt_m = meta
        r._gt_k = _meta_id(meta) if mid is None else mid
        return r

    def __del__(self):
        s = self.__dict__.get("_gt_s")
        if s is not None and not s.closed:
            s.freed.append(self._gt_id)  # joins the stream before the next instruction
            s.counters["frees"] += 1

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        with LOCK:
            if HELD["pending"]:
                check_interrupt()  # a Ctrl-C held during gt's last op: raised here, between ops
            return record(func, args, kwargs or {})

    # -- sync points that do not pass through the dispatcher ------------------------------
    def cpu(self, memory_format=torch.preserve_format) -> torch.Tensor:  # noqa: ARG002
        """The value as a plain CPU tensor (waits for the worker)."""
        from gt_core.client.tensor_io import mark_fetched

        s = self._gt_s
        s.check()
        return mark_fetched(s.request("fetch", self._gt_id))

    def to(self, *args, **kwargs):
        """torch's ``to``; outside a capture, ``to("cpu")`` fetches (see ``_tensor_io.to``)."""
        from gt_core.client.tensor_io import to

        return to(self, args, kwargs)

    def __reduce_ex__(self, protocol):
        """Pickled (``torch.save``) as the plain tensor it stands for: its value is fetched."""
        from gt_core.client.tensor_io import reduce

        return reduce(self, protocol)

    def __copy__(self):
        """A tensor sharing this value on the worker, as copy.copy shares storage in eager."""
        from gt_core.client.tensor_io import shallow_copy

        return shallow_copy(self)

    def __deepcopy__(self, memo):
        """A copy made on the worker (a recorded clone), as eager's deepcopy makes one."""
        from gt_core.client.tensor_io import deepcopy

        return deepcopy(self, memo)

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
                from gt_core.client.tensor_io import become_plain, is_fetched

                if is_fetched(other):  # a move to the CPU (Module.cpu()): p becomes that tensor
                    become_plain(self, other)
                    return
                other = upload(self._gt_s, other)
            fresh = torch.ops.aten.alias.default(other)
            _rebind(self, fresh)


def _rebind(p: Proxy, fresh: Proxy) -> None:
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
    with torch._C._DisableTorchDispatch():
        data = t.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        data = data.clone()  # the worker's copy must not change when the user's tensor does
        # The pipe to the worker drops the conjugate and negative bits of a lazy view
        # (x.conj()): it would arrive as x itself. Sent materialized.
        data = data.resolve_conj().resolve_neg()
    vid = session.new_ids(1)[0]
    session.counters["uploads"] += 1
    if data.dim() == 0 and not data.is_complex():
        # A scalar travels as an op with its value in the arguments: no upload barrier cuts
        # the block (Adam's foreach step adds torch.tensor(1.0) every step), and a value that
        # changes is lifted into an input of the compiled block like any other float.
        idx = session.op(_SCALAR_TENSOR)
        session.emit((OP, idx, (data.item(),), {"dtype": data.dtype, "device": _CPU}, (vid,)))
        p = Proxy(session, vid, _meta_of(data))
        p._gt_v = data
    else:
        session.emit((PUT, vid, data))
        p = Proxy(session, vid, _meta_of(data))
    if not cache:
        return p
    try:
        _uploads[key] = (
            weakref.ref(t, lambda _r, k=key: _uploads.pop(k, None)),
            t._version,
            session.gen,
            weakref.ref(p),
        )
    except TypeError:
        pass
    return p


# -- recording ----------------------------------------------------------------------------
def _current_session():
    from gt_core.client import capture as _capture

    s = _capture.session()
    s.check()  # a factory op for a dead worker fails now, not at some later flush
    return s


class _Walk:
    """One op's arguments: their cache key, the form sent (with Refs), the proxies met.

    A class, not a closure: a recursive closure is a reference cycle that would keep the
    argument proxies alive until the garbage collector runs, and delay their frees.
    """

    __slots__ = ("func", "session", "proxies", "plain", "floats_free")

    def __init__(self, func):
        self.func = func
        self.floats_free = _floats_free(func)
        self.session = None
        self.proxies: list[Proxy] = []
        self.plain: dict[int, torch.Tensor] = {}  # index in proxies -> plain tensor uploaded there

    def walk(self, a):
        """-> (cache key part, the argument as sent).

        A tensor's key part is its metadata id (an int); a constant's is (type, value), so
        1, 1.0 and True stay apart and never collide with a metadata id.
        """
        t = type(a)
        if t is Proxy and a._gt_s is self.session:  # the common case, first
            self.proxies.append(a)
            return a._gt_k, Ref(a._gt_id)
        if t is float and self.floats_free:
            return _ANY_FLOAT, a
        if t is int or t is float or t is bool or a is None:
            return (t, a), a
        if isinstance(a, torch.Tensor):
            if not isinstance(a, Proxy):
                if self.session is None:
                    self.session = _current_session()
                self.plain[len(self.proxies)] = a
                a = upload(self.session, a)
            s = a._gt_s
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
            return a._gt_k, Ref(a._gt_id)
        if t is list or t is tuple:
            parts = [self.walk(x) for x in a]
            return (t, tuple(p[0] for p in parts)), t(p[1] for p in parts)
        if t is torch.Generator:
            raise UnsupportedOperation(
                f"{self.func}: an explicit torch.Generator cannot drive a gt worker tensor; "
                "use torch.manual_seed inside the capture instead"
            )
        return (t, a), a


_SCALARS = (int, float, bool, type(None))
_ANY_FLOAT = (
    float,
    None,
)  # a float's cache key part where its value cannot change the result's metadata
_float_free: dict = {}


def _floats_free(func) -> bool:
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


_SCALAR_TENSOR = torch.ops.aten.scalar_tensor.default
_CPU = torch.device("cpu")


def record(func, args, kwargs):
    """Record ``func(*args, **kwargs)`` as an instruction and return proxies for its outputs."""
    # Inside a hot block's occurrence: the op the plan expects next, checked against what
    # recording it found before, bound without building an instruction (see follow).
    if args:
        a = args[0]
        if type(a) is Proxy:
            s = a._gt_s
            if s.replay.cands and not s.closed and s.dead is None:
                if s.freed:
                    s._frees()  # they come first, as emit would put them
                if len(s.replay.cands) == 1:
                    out = follow(s, func, args, kwargs)
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
        if t is Proxy:
            if a._gt_v is not None:
                break  # shadowed: the slow path keeps the shadow up to date
            s = a._gt_s
            if s is not session:
                if session is not None or s.closed or s.dead is not None:
                    break
                session = s
            proxies.append(a)
            key.append(a._gt_k)
            sent.append(Ref(a._gt_id))
        elif t in _SCALARS:
            key.append(_ANY_FLOAT if t is float and _floats_free(func) else (t, a))
            sent.append(a)
        elif (t is list or t is tuple) and all(type(x) is int for x in a):
            key.append((t, tuple([(int, x) for x in a])))
            sent.append(a)
        else:
            break
    else:
        for k, v in kwargs.items():
            tv = type(v)
            if tv not in _SCALARS:
                session = None
                break
            key.append((k, _ANY_FLOAT if tv is float and _floats_free(func) else (tv, v)))
        if session is not None:
            entry = _meta_cache.get(tuple(key))
            if entry is not None and entry is not _SYNC:
                t = entry[0]
                kind = t[0]
                # one new tensor out, or an input returned unchanged (in place): the
                # two most common op shapes of all
                if (kind == _NEW and entry[1] == 1) or (kind == _ALIAS and t[2] is None):
                    session.counters["ops"] += 1
                    idx = session.op_index.get(func)
                    if idx is None:
                        idx = session.op(func)
                    if kind == _NEW:
                        vid = session.next_id
                        session.next_id = vid + 1
                        outs = (vid,)
                    else:
                        outs = (None,)
                    if session.freed:
                        session._frees()  # first, so the position below is this op's
                    cands = session.replay.cands
                    c = cands[0] if len(cands) == 1 else None
                    pos = c.pos if c is not None else -1
                    session.emit((OP, idx, tuple(sent), kwargs, outs))
                    if c is not None and c.pos == pos + 1:
                        # matched as the plan's entry pos: what the next occurrences reuse
                        want = _varying(c.entries[pos], args, kwargs, func)
                        c.plan.learned[pos] = (func, want, t, len(proxies))
                    return Proxy(session, vid, t[1], t[2]) if kind == _NEW else proxies[t[1]]
    return _record(func, args, kwargs)


def follow(session, func, args, kwargs):
    """The op the plan of the occurrence being matched expects next, recorded by the plan.

    Taken only where recording that entry once found this op, and the parts of its cache key
    that can vary between occurrences (its tensors' metadata, its lifted scalars' kind) are
    the same now; the rest of the key is the template's literals, checked equal. So the
    output's metadata is what the cache would give. Anything else returns None: the op is
    recorded the usual way, and matched (or not) as an instruction.
    """
    rp = session.replay
    c = rp.cands[0]
    pos = c.pos
    learned = c.plan.learned[pos]
    if learned is None or learned[0] is not func:
        return None
    _, want, t, n_proxies = learned
    e = c.entries[pos]
    eargs, ekw = e[2], e[3]
    if len(args) != len(eargs) or len(kwargs) != len(ekw):
        return None
    parts = []
    proxies = []
    for tmpl, a in zip(eargs, args):  # noqa: B905 (lengths checked)
        ta = type(a)
        if ta is Proxy:
            if a._gt_s is not session or a._gt_v is not None or type(tmpl) is not Slot:
                return None
            if not c._bind(tmpl, a._gt_id):
                return None
            parts.append(a._gt_k)
            proxies.append(a)
        elif type(tmpl) is Scalar:
            if ta is not float and ta is not int:
                return None
            c.scalars[tmpl.k] = float(a)
            parts.append(_scalar_part(a, func))
        else:  # a literal: only record's inline kinds, equal to the template's
            if ta is list or ta is tuple:
                if not all(type(x) is int for x in a):
                    return None  # (before comparing: a proxy in a list must not be compared)
            elif ta not in _SCALARS:
                return None
            if type(tmpl) is not ta or tmpl != a:
                return None
    for k, v in kwargs.items():
        tmpl = ekw.get(k, _MISSING)
        tv = type(v)
        if type(tmpl) is Scalar:
            if tv is not float and tv is not int:
                return None
            c.scalars[tmpl.k] = float(v)
            parts.append(_scalar_part(v, func))
        elif tv is not type(tmpl) or tmpl != v or tv not in _SCALARS:
            return None
    if tuple(parts) != want or len(proxies) != n_proxies:
        return None
    outs = e[4]
    if t[0] == _NEW:
        if outs[0] != len(c.produced):
            return None
        vid = session.next_id
        session.next_id = vid + 1
        c.produced.append(vid)
        c.bound.add(vid)
        result = Proxy(session, vid, t[1], t[2])
    else:
        result = proxies[t[1]]
    session.counters["ops"] += 1
    rp.followed += 1
    c.pos = pos + 1
    rp.kept.append(None)
    if c.pos == c.n:
        rp._complete(c)
    return result


def _scalar_part(a, func):
    """A lifted scalar's part of the cache key (as record builds it)."""
    return _ANY_FLOAT if type(a) is float and _floats_free(func) else (type(a), a)


def _varying(e, args, kwargs, func) -> tuple:
    """The parts of an op's cache key a plan entry's template leaves free: its tensors'
    metadata and its lifted scalars' (the template's literals fix the rest)."""
    parts = []
    for tmpl, a in zip(e[2], args):  # noqa: B905 (the entry matched these arguments)
        if type(a) is Proxy:
            parts.append(a._gt_k)
        elif type(tmpl) is Scalar:
            parts.append(_scalar_part(a, func))
    for k, v in kwargs.items():
        if type(e[3].get(k)) is Scalar:
            parts.append(_scalar_part(v, func))
    return tuple(parts)


_MISSING = object()


_SET_STORAGE = (
    torch.ops.aten.set_.source_Storage,
    torch.ops.aten.set_.source_Storage_storage_offset,
)


def _record(func, args, kwargs):
    if func in _SET_STORAGE and isinstance(args[1], torch.UntypedStorage):
        from gt_core.client.tensor_io import set_host_storage  # torch.load builds tensors this way

        return set_host_storage(func, args, kwargs)
    w = _Walk(func)
    walk = w.walk
    pa = [walk(a) for a in args]
    session, proxies, plain = w.session, w.proxies, w.plain
    if kwargs:
        pk = {k: walk(v) for k, v in kwargs.items()}
        session = w.session
        key = (func, *[p[0] for p in pa], *[(k, v[0]) for k, v in pk.items()])
        sent_kwargs = {k: v[1] for k, v in pk.items()}
    else:
        key = (func, *[p[0] for p in pa])
        sent_kwargs = {}
    if session is None:  # a factory op (no tensor arguments) inside capture
        session = _current_session()
    sent_args = tuple([p[1] for p in pa])
    try:
        entry = _meta_cache.get(key)
    except TypeError:  # an unhashable argument: infer every time
        key, entry = None, None
    if entry is None:
        entry = _infer(func, args, kwargs)
        if key is not None:
            _meta_cache[key] = entry
        where = _user_line()  # a first sight: worth the frame walk (errors name the line)
    else:
        where = None
    shadowed = any(p._gt_v is not None for p in proxies)
    if entry is _SYNC:
        if shadowed and all(p._gt_v is not None for p in proxies) and _scalar_result(func):
            return _on_shadows(func, args, kwargs)  # .item() of a step counter: no round trip
        return _run_now(session, func, sent_args, sent_kwargs, proxies)
    template, n_new, mask = entry
    idx = session.op(func)
    ids = session.new_ids(n_new) if n_new else ()
    if len(mask) == n_new:
        outs = tuple(ids)
    else:  # some outputs are inputs (in place): the worker binds only the new ones
        it = iter(ids)
        outs = tuple(next(it) if new else None for new in mask)
    session.counters["ops"] += 1
    session.emit((OP, idx, sent_args, sent_kwargs, outs))
    if where is not None and ids:
        session.site(ids[0], where)
    out = _build(template, session, iter(ids), proxies)
    if shadowed:
        _shadow(session, func, args, kwargs, out, proxies)
    if plain and template[0] == _ALIAS and template[1] in plain and func._schema.is_mutable:
        # In place on a plain tensor with a worker argument: bring the result home.
        target = plain[template[1]]
        with torch._C._DisableTorchDispatch():
            target.copy_(out.cpu())
        return target
    return out


def _user_line() -> tuple[str, int] | None:
    """(file, line) of the innermost frame that is neither gt's, torch's nor the stdlib's."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_OURS) and not name.startswith("<frozen"):
            return name, f.f_lineno
        f = f.f_back
    return None


def _build(template, session, ids, proxies):
    kind = template[0]
    if kind == _NEW:
        return Proxy(session, next(ids), template[1], template[2])
    if kind == _ALIAS:
        p = proxies[template[1]]
        if template[2] is not None and template[2] != p._gt_m:  # in-place op changed metadata
            _restride(p, template[2])
        return p
    if kind is None:
        return template[1]
    return kind(_build(t, session, ids, proxies) for t in template[1])


def _restride(p: Proxy, meta: tuple) -> None:
    shape, stride, offset, _ = meta
    with torch._C._DisableTorchDispatch():
        torch._C.TensorBase.as_strided_(p, shape, stride, offset)
    p._gt_m, p._gt_k = meta, _meta_id(meta)


def _to_meta(a, metas: list):
    if isinstance(a, torch.Tensor):
        if isinstance(a, Proxy):
            shape, stride, offset, dtype = a._gt_m
        else:
            shape, stride, offset, dtype = tuple(a.shape), a.stride(), a.storage_offset(), a.dtype
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
        return type(a)(_to_meta(x, metas) for x in a)
    return a


def _scalar_result(func) -> bool:
    return any(
        not isinstance(r.type, torch.TensorType) and "Tensor" not in str(r.type)
        for r in func._schema.returns
    )


# -- shadows ------------------------------------------------------------------------------
_SHADOW_MAX = 64  # elements: a new (non-view) result larger than this keeps no shadow


def _plain(a):
    """Arguments with shadowed proxies replaced by their shadows."""
    if isinstance(a, Proxy):
        return a._gt_v
    if type(a) in (list, tuple):
        return type(a)(_plain(x) for x in a)
    return a


def _on_shadows(func, args, kwargs):
    with torch._C._DisableTorchDispatch():
        return func(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()})


def _shadow(session, func, args, kwargs, out, proxies) -> None:
    """Keep shadows equal to the worker's values after ``func`` was recorded on ``proxies``."""
    if (
        all(p._gt_v is not None for p in proxies)
        and torch.Tag.nondeterministic_seeded not in func.tags
    ):
        try:
            res, ok = _on_shadows(func, args, kwargs), True
        except Exception:
            res, ok = None, False
        if ok:
            storages = {p._gt_v.untyped_storage().data_ptr() for p in proxies}
            _bind_shadows(out, res, storages)
            return
        for p in proxies:  # could not follow: these values are asked of the worker from now on
            p._gt_v = None
        return
    if func._schema.is_mutable:
        # A shadowed value written with unshadowed inputs: refresh it from the worker (the
        # copy goes into the shadow's storage, so views sharing it follow). Only what the op
        # writes: a shadowed input it only reads (`param.mul_(1 - lr * wd)`) stays as it is.
        for p in _written(func, args, kwargs):
            if type(p) is Proxy and p._gt_v is not None:
                fresh = session.request("fetch", p._gt_id)
                with torch._C._DisableTorchDispatch():
                    p._gt_v.copy_(fresh)


def _written(func, args, kwargs) -> list:
    """The arguments ``func`` writes in place (tensors, or items of tensor lists)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        out.extend(v if type(v) in (list, tuple) else [v])
    return out


def _bind_shadows(out, res, storages) -> None:
    if isinstance(out, Proxy):
        if isinstance(res, torch.Tensor) and (
            res.numel() <= _SHADOW_MAX or res.untyped_storage().data_ptr() in storages
        ):
            out._gt_v = res
    elif type(out) in (list, tuple) and type(res) in (list, tuple) and len(out) == len(res):
        for o, r in zip(out, res, strict=True):
            _bind_shadows(o, r, storages)


def _infer(func, args, kwargs):
    """The output template of ``func`` from a meta run, or _SYNC if it needs real data."""
    if _scalar_result(func):
        return _SYNC  # a Python scalar or bool result: only the worker knows it
    metas: list = []
    margs = _to_meta(args, metas)
    mkwargs = {k: _to_meta(v, metas) for k, v in kwargs.items()}
    if any(a.name == "device" for a in func._schema.arguments):
        mkwargs["device"] = torch.device("meta")
    before = [_meta_of(m) for m in metas]
    try:
        with torch._C._DisableTorchDispatch():
            out = func(*margs, **mkwargs)
    except Exception:
        # Only the real kernel knows: a data-dependent output shape (nonzero, unique, boolean
        # masks, indices read from a tensor as tensor_split's), a project's op without a fake
        # kernel, or a meta kernel stricter than the real one (circular padding of an empty
        # tensor). The worker runs it at once; a call that is wrong raises eager's own error.
        return _SYNC
    counter = [0]
    template = _template(out, metas, before, counter)
    return template, counter[0], tuple(_mask(template))


def _mask(template):
    """For each tensor output in order: True if new, False if it is an input."""
    kind = template[0]
    if kind == _NEW:
        yield True
    elif kind == _ALIAS:
        yield False
    elif kind is not None:
        for t in template[1]:
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
                after = _meta_of(m)
                return (_ALIAS, i, after if after != before[i] else None)
        counter[0] += 1
        meta = _meta_of(o)
        return (_NEW, meta, _meta_id(meta))
    if type(o) in (list, tuple):
        return (type(o), tuple(_template(x, metas, before, counter) for x in o))
    return (None, o)


def _run_now(session, func, args, kwargs, proxies):
    """Flush and run ``func`` on the worker now; its outputs come back described."""
    idx = session.op(func)
    session.counters["ops"] += 1
    base = session.next_id
    described, end = session.request("call", (idx, args, kwargs, base))
    session.next_id = max(session.next_id, end)
    return _described(described, session, {p._gt_id: p for p in proxies})


def _described(d, session, by_id):
    """Proxies for the worker's description of a sync op's outputs."""
    if type(d) is Ref:
        return by_id[d.id]
    if type(d) is tuple and len(d) == 5 and isinstance(d[4], torch.dtype):
        return Proxy(session, d[0], d[1:])
    if type(d) in (list, tuple):
        return type(d)(_described(x, session, by_id) for x in d)
    return d


class CaptureMode(TorchDispatchMode):
    """Inside capture, every aten op (factories included) is recorded for the worker."""


def _capture_dispatch(self, func, types, args=(), kwargs=None):
    kwargs = kwargs or {}
    if (
        (args and type(args[0]) is Proxy)
        or _has_proxy(args)
        or _has_proxy(kwargs.values())
        or func in _LIFTS
        or (_makes_tensors(func) and not _has_tensor(args) and not _has_tensor(kwargs.values()))
    ):  # an op on worker tensors, or a factory: the new tensor lives on the worker
        with LOCK:
            if HELD["pending"]:
                check_interrupt()
            return record(func, args, kwargs)
    # Plain tensors from outside stay plain (numpy(), printing and torch internals use
    # them), and so do bookkeeping ops such as profiler ranges.
    return func(*args, **kwargs)


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


def _has_proxy(xs) -> bool:
    for x in xs:
        if isinstance(x, Proxy) or (type(x) in (list, tuple) and _has_proxy(x)):
            return True
    return False


def _has_tensor(xs) -> bool:
    for x in xs:
        if isinstance(x, torch.Tensor) or (type(x) in (list, tuple) and _has_tensor(x)):
            return True
    return False
