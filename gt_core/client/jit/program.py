"""The values a recorded call read from shadows, and how a replay reads them again.

A small tensor made in the capture keeps a shadow on the client (``client.shadows``): an
optimizer's step count, a tensor learning rate. Its value read as a Python number (Adam's
``step_t.item()`` for its bias corrections, ``alpha=-lr`` of a tensor ``lr``) costs no round
trip, but it is a number a replay must know without running the Python.

While a jitted call records, a :class:`ShadowLog` keeps, in order, each op run on shadows
(``step_t += 1``, ``-lr``) and each value read. A float read becomes a ``Knob`` whose
expression is ``("r", j)``: the numbers computed from it (``lr / (1 - beta1 ** step)``) flow
into the block like an optimizer's settings (``jit.settings``). A replay runs the log again
on copies of its inputs' shadows as they are now (``rerun``), so the j-th read gives this
call's value; once its RUN is sent, the copies become the shadows (``commit``): the block
did the same to the worker's values.

A log that cannot be run again (a shadow refreshed from the worker, an op that could not
follow its shadows, a read of an int or a bool, an input that cannot be found again) is
``opaque``: a call whose values it read is not replayed.
"""

from __future__ import annotations

import weakref

import torch

from gt_core.client.jit.knob import Knob, agree, reads_in
from gt_core.client.jit.settings import floats_in
from gt_core.stream.lift import set_at

__all__ = ["ShadowLog", "Rerun", "differs", "reads_in"]


class _Slot:
    """A tensor argument of a logged step: the k-th value of the log."""

    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k


class ShadowLog:
    """What one recorded call did on shadows (see the module's docstring)."""

    def __init__(self, cls):
        self.cls = cls  # the proxy class
        self.steps: list = []  # ("op" | "read", func, args, kwargs, out slots)
        # slot -> a weak reference to the proxy it stood for (a strong one would keep the
        # step's temporaries alive past its end: outputs of the block), and id(proxy) -> slot
        self.proxies: list = []
        self.at: dict[int, int] = {}
        self.made: set[int] = set()  # slots an op of the log produced
        self.first: dict[int, torch.Tensor] = {}  # slot -> its shadow when first seen
        self.reads: list[float] = []  # each float read, in order
        self.opaque: str | None = None  # why the log cannot be run again
        self.last = None  # the newest read's Knob, until Proxy.item takes it
        self.ledger: dict = {}  # the call's {number: [expression]} (jit.settings.wrapped)
        self.steered: tuple[set, set] = (set(), set())  # (jit.settings.steered)
        # step -> [(path, expressions)]: how a number an op of the log takes each call is
        # computed (a tensor lr divided by a bias correction): a rerun computes it anew (differs)
        self.flowing: dict = {}
        self.sources: list | None = None  # (slot, place or argument index) per input, once bound

    def ended(self, ledger: dict, steered: tuple[set, set]) -> None:
        """The call has ended: its numbers' ledger and what its Knobs steered."""
        self.ledger, self.steered = ledger, steered

    # -- while the call records (client.record and client.shadows call these) ------------
    def op(self, func, args, kwargs, out) -> None:
        """``func`` ran on shadows and gave ``out`` (proxies with shadows)."""
        a, kw = self._slots(args), {k: self._slots(v) for k, v in kwargs.items()}
        outs = []
        for p in _proxies(out, self.cls):
            k = self._slot(p)
            if k is None:
                k = self._new(p, made=True)
            outs.append(k)
        self.steps.append(("op", func, a, kw, outs))

    def read(self, func, args, kwargs, value):
        """``func`` read ``value`` from shadows: a float comes back as a Knob ``("r", j)``."""
        a, kw = self._slots(args), {k: self._slots(v) for k, v in kwargs.items()}
        self.steps.append(("read", func, a, kw, ()))
        if type(value) is not float:
            kind = type(value).__name__
            self.opaque = (
                f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} read from a tensor ({func})"
            )
            return value
        self.reads.append(value)
        self.last = Knob(value, ("r", len(self.reads) - 1))
        return self.last

    def took(self, value):
        """What ``Proxy.item`` returns for ``value``: the Knob of the read that just gave it
        (torch's item() passes the number through C++, which drops its kind)."""
        last, self.last = self.last, None
        return last if last is not None and float.__float__(last) == value else value

    def lost(self, why: str) -> None:
        """A shadow could not follow an op (it was refreshed from the worker, or dropped)."""
        self.opaque = self.opaque or why

    def _slot(self, p) -> int | None:
        k = self.at.get(id(p))
        return k if k is not None and self.proxies[k]() is p else None  # (an id reused)

    def _new(self, p, made: bool = False) -> int:
        k = len(self.proxies)
        self.proxies.append(weakref.ref(p))
        self.at[id(p)] = k
        if made:  # (a rerun makes it anew)
            self.made.add(k)
        elif p.gt_shadow is not None:
            with torch._C._DisableTorchDispatch():
                self.first[k] = p.gt_shadow.clone()
        return k

    def _slots(self, a):
        if isinstance(a, self.cls):
            k = self._slot(a)
            return _Slot(self._new(a) if k is None else k)
        if type(a) in (list, tuple):
            return type(a)(self._slots(x) for x in a)
        return a

    # -- after the call -----------------------------------------------------------------
    def bind(self, before: list, leaves: list, puts: list) -> None:
        """Say where each value the log did not make comes from: a place the step reaches
        (``before``: (place, proxy) as the call began), an argument, or a tensor the call
        made from host data (a constant: its value when first seen)."""
        places = {id(p): place for place, p in before if p is not None}
        args = {id(x): i for i, x in enumerate(leaves) if isinstance(x, self.cls)}
        made_here = {id(p) for _, p, _, _ in puts}
        self.sources = []
        for k, ref in enumerate(self.proxies):
            p = ref()
            if k in self.made or id(p) in made_here:
                continue
            src = None if p is None else places.get(id(p), args.get(id(p)))
            if src is None:
                self.opaque = self.opaque or "a small tensor jit cannot find again"
                break
            self.sources.append((k, src))
        # The log keeps no proxy alive past the call (nor a Knob: the last read's number).
        self.proxies, self.at, self.last = [], {}, None


class Rerun:
    """The log run again for one call: its reads, and the inputs' new shadows."""

    def __init__(self, log: ShadowLog, leaves, settings: list):
        self.reads: list[float] | None = None
        self.targets: list = []  # (proxy, its new shadow value) to commit
        vals: dict[int, torch.Tensor] = {}
        with torch._C._DisableTorchDispatch():
            for k, src in log.sources:
                p = leaves[src] if type(src) is int else src.read()
                shadow = getattr(p, "gt_shadow", None)
                if shadow is None:
                    return  # (its shadow is gone: this call records instead)
                vals[k] = shadow.clone()
                self.targets.append((p, vals[k]))
            for k, t in log.first.items():  # (tensors made from host data: constants)
                if k not in vals:
                    vals[k] = t.clone()
            try:
                self.reads = _run(log, vals, settings)
            except Exception:  # (shadows of another shape or dtype now: this call records)
                self.reads, self.targets = None, []

    def commit(self) -> None:
        """The RUN was sent: the inputs' shadows now hold what the block makes of them."""
        with torch._C._DisableTorchDispatch():
            for p, v in self.targets:
                if p.gt_shadow is not None:
                    p.gt_shadow.copy_(v)


def _run(log: ShadowLog, vals: dict, settings: list) -> list[float]:
    reads: list[float] = []
    for i, (kind, func, args, kwargs, outs) in enumerate(log.steps):
        a, kw = list(_values(args, vals)), {n: _values(v, vals) for n, v in kwargs.items()}
        for path, exprs in log.flowing.get(i, ()):
            v = agree(exprs, settings, reads)
            if v is None:
                raise ValueError(f"settings parted for {func}")
            set_at(a, kw, path, v)
        res = func(*a, **kw)
        if kind == "read":
            reads.append(float(res))
            continue
        for k, r in zip(outs, _tensors(res), strict=False):
            vals.setdefault(k, r)
    return reads


def _proxies(out, cls):
    if isinstance(out, cls):
        yield out
    elif type(out) in (list, tuple):
        for x in out:
            yield from _proxies(x, cls)


def _tensors(res):
    if isinstance(res, torch.Tensor):
        return [res]
    if type(res) in (list, tuple):
        return [t for x in res for t in _tensors(x)]
    return []


def _values(a, vals):
    if type(a) is _Slot:
        return vals[a.k]
    if type(a) in (list, tuple):
        return type(a)(_values(x, vals) for x in a)
    return a


def differs(a: ShadowLog | None, b: ShadowLog | None, a_settings, b_settings) -> str | None:
    """What two recorded calls did otherwise on shadows (None: the same ops, their reads
    aside, and each number that differs computed alike from each call's settings and reads,
    kept in ``b.flowing``: a replay runs b's log again; or neither read a value)."""
    if not (a is not None and a.reads) and not (b is not None and b.reads):
        return None  # (ops on shadows alone: the block does them, the shadows are let go)
    sa = [_shape(st) for st in a.steps] if a is not None else []
    sb = [_shape(st) for st in b.steps] if b is not None else []
    if len(sa) != len(sb):
        return f"{len(sa)} -> {len(sb)} ops on small tensors"
    b.flowing = {}
    made = 0  # reads before this step: an expression can use those only
    for i, (x, y, st) in enumerate(zip(sa, sb, b.steps, strict=True)):
        if x[:2] != y[:2] or _without_numbers(x) != _without_numbers(y):
            return f"{x[1]} on a small tensor, then {y[1]}"
        for (path, u), (_, v) in zip(_floats_at(a.steps[i]), _floats_at(st), strict=True):
            found = tuple(
                e
                for e in b.ledger.get(v, ())
                if max(reads_in(e), default=-1) < made
                and agree((e,), a_settings, a.reads) == u
                and agree((e,), b_settings, b.reads) == v
            )
            if u == v and found:  # (by origin: a read steered nowhere, recomputed anew)
                found = tuple(e for e in found if not reads_in(e) & b.steered[1])
            if not found:
                if u == v:
                    continue  # (a number of the log's own: kept as recorded)
                return f"{y[1]} on a small tensor takes another number each call: {u} -> {v}"
            b.flowing.setdefault(i, []).append((path, found))
        made += st[0] == "read"
    return None


def _without_numbers(shape):
    if type(shape) is float:
        return float
    if type(shape) in (list, tuple):
        return tuple(_without_numbers(x) for x in shape)
    return shape


def _floats_at(step):
    _, _, args, kwargs, _ = step
    return list(floats_in(args, kwargs))


def _shape(step) -> tuple:
    kind, func, args, kwargs, _ = step
    return (kind, str(func), _plain(args), sorted(_plain(kwargs).items()))


def _plain(a):
    if type(a) is _Slot:
        return ("slot", a.k)
    if type(a) in (list, tuple):
        return tuple(_plain(x) for x in a)
    if type(a) is dict:
        return {k: _plain(v) for k, v in a.items()}
    return a
