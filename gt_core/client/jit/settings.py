"""Optimizer settings that flow into a replayed block: a learning rate a scheduler changes.

While a jitted step records, each float setting of its optimizers' param groups (``lr``,
``weight_decay``, the ``betas``...) is a :class:`Knob`: a float that remembers how it was
computed from the settings, through the arithmetic an optimizer does with it (``-lr``,
``1 - lr * weight_decay``). The numbers the recorded call passed to ops are then attributed
to those expressions by value (``attribute``). Where two recorded calls passed different
numbers at the same place (the worker lifts those into inputs of the block), and both are
the same expression of their calls' settings, a replayed call computes that expression from
the settings as they are now and sends it with the RUN (``evaluate``). A number that changed
and is no such expression refuses replay, as before.
"""

from __future__ import annotations

import contextlib
import math
import operator
import threading
import types

import torch

from gt_core.stream.instructions import FREE as _FREE
from gt_core.stream.instructions import OP as _OP

__all__ = [
    "Knob",
    "floats_in",
    "wrapped",
    "attribute",
    "evaluate",
    "agree",
    "groups",
    "settings_in",
    "knobs",
    "steered",
    "touched",
    "reads_in",
    "by_origin",
]

_NOT_KNOBS = ("params", "capturable")  # (capturable: set while recording, see traced)

_here = threading.local()  # .ledger: {value: [expression]} of the call recording now


class Knob(float):
    """A float setting, or a number computed from settings; ``expr`` says how.

    An expression is ``("k", group, key, index)`` (a setting: the ``group``-th param group
    of the step's optimizers, its ``key``, ``index`` into a tuple such as ``betas`` or None),
    ``("c", value)`` (a constant), ``("r", j)`` (the j-th value the call read from a shadow:
    jit.program), ``("neg", e)``, or ``(name, left, right)`` of an ``operator`` function of
    two numbers.
    """

    def __new__(cls, value: float, expr: tuple):
        k = super().__new__(cls, value)
        k.expr = expr
        ledger = getattr(_here, "ledger", None)
        if ledger is not None:
            ledger.setdefault(float(value), []).append(expr)
        return k

    def __neg__(self):
        return Knob(-float(self), ("neg", self.expr))

    def __reduce__(self):  # (pickled as the plain number it is)
        return (float, (float(self),))


def _binary(name: str, reflected: bool):
    fn = getattr(operator, name)

    def method(self, other):
        if type(other) is Knob:
            right = other.expr
        elif type(other) is float or type(other) is int:
            right = ("c", other)
        else:
            return NotImplemented  # (a tensor: its own reflected method)
        a, b = (float(other) if type(other) is Knob else other), float(self)
        if reflected:
            return Knob(fn(a, b), (name, right, self.expr))
        return Knob(fn(b, a), (name, self.expr, right))

    return method


for _name in ("add", "sub", "mul", "truediv", "pow"):
    setattr(Knob, f"__{_name}__", _binary(_name, False))
    setattr(Knob, f"__r{_name}__", _binary(_name, True))


def _escaping(name: str):
    """A float method whose result is no Knob: a comparison, a truth value, an int, a
    rounding. What the step does with it is not followed (a branch: ``if weight_decay !=
    0``), so the settings and reads it came from are ``steered``: they never flow by their
    origin alone (see ``steered``), only where they changed between the recorded calls."""
    fn = getattr(float, name)

    def method(self, *args):
        steered = getattr(_here, "steered", None)
        if steered is not None:
            steered.add(self.expr)
        return fn(self, *args)

    return method


for _name in (
    "eq", "ne", "lt", "le", "gt", "ge", "bool", "int", "round", "trunc", "floor", "ceil",
    "abs", "pos", "mod", "rmod", "floordiv", "rfloordiv", "divmod", "rdivmod",
):  # fmt: skip
    setattr(Knob, f"__{_name}__", _escaping(f"__{_name}__"))
Knob.__hash__ = float.__hash__  # (with __eq__ defined here, as a float's)


@contextlib.contextmanager
def _watch_math():
    """``math``'s functions see a Knob as the float it is (C reads its value): while a call
    records, one given a Knob marks it steered (``math.sqrt(1 - beta2)`` is not followed)."""
    names = [n for n in dir(math) if isinstance(getattr(math, n), types.BuiltinFunctionType)]
    saved = {n: getattr(math, n) for n in names}
    for n, fn in saved.items():
        setattr(math, n, _watched(fn))
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(math, n, fn)


def _watched(fn):
    def call(*args, **kwargs):
        steered = getattr(_here, "steered", None)
        if steered is not None:
            steered.update(a.expr for a in (*args, *kwargs.values()) if type(a) is Knob)
        return fn(*args, **kwargs)

    return call


def steered(exprs) -> tuple[set, set]:
    """The settings ``(group, key)`` and the reads ``j`` of ``exprs`` (Knobs' expressions
    that steered Python or left the Knobs: ``_escaping``)."""
    settings, reads = set(), set()
    for e in exprs:
        settings |= settings_in(e)
        reads |= reads_in(e)
    return settings, reads


def reads_in(expr) -> set[int]:
    """The reads (their index j) that an expression uses."""
    if expr[0] == "r":
        return {expr[1]}
    if expr[0] in ("k", "c"):
        return set()
    return set().union(*(reads_in(e) for e in expr[1:]))


def groups(opts) -> list:
    """The param groups of ``opts``, in the order expressions number them."""
    return [g for opt in opts for g in opt.param_groups]


@contextlib.contextmanager
def wrapped(opts, ledger: dict, steered_: set | None = None):
    """The float settings of ``opts`` as Knobs while the step records (``ledger`` collects
    the numbers computed from them, ``steered_`` the expressions that left them: see
    ``_escaping``); each is put back after, unless the step replaced it."""
    _here.ledger = ledger  # (first: the settings themselves are numbers ops are passed)
    _here.steered = steered_
    watched = _watch_math() if steered_ is not None else contextlib.nullcontext()
    put = []
    for gi, group in enumerate(groups(opts)):
        for key, v in list(group.items()):
            if type(v) is float:
                group[key] = Knob(v, ("k", gi, key, None))
            elif type(v) is tuple and v and all(type(x) is float for x in v):
                group[key] = tuple(Knob(x, ("k", gi, key, i)) for i, x in enumerate(v))
            else:
                continue
            put.append((group, key, v, group[key]))
    try:
        with watched:
            yield
    finally:
        _here.ledger, _here.steered = None, None
        for group, key, v, knob in put:
            now = group.get(key)
            if now is knob:
                group[key] = v
            elif type(now) is Knob:  # (the step wrote a number computed from a setting)
                group[key] = float(now)
            elif type(now) is tuple and any(type(x) is Knob for x in now):
                group[key] = tuple(float(x) if type(x) is Knob else x for x in now)


def attribute(instrs, ledger: dict) -> dict:
    """{(position among the OP and FREE instructions, path): [expression]} for each float an
    op was passed that a setting's arithmetic computed (matched by value)."""
    out: dict = {}
    if not ledger:
        return out
    j = 0
    for ins in instrs:
        if ins.code == _OP:
            for path, v in _floats(ins):
                exprs = ledger.get(v)
                if exprs:
                    out[(j, path)] = exprs
        if ins.code in (_OP, _FREE):
            j += 1
    return out


def by_origin(instrs, ledger: dict, spans: list, steer: set) -> dict:
    """{site: expressions} of each float an op inside an optimizer's step (``spans`` of
    ``instrs``: see traced) was passed that the arithmetic of settings and reads computed,
    from settings and reads no Knob steered (``steer``). Such a number is sent anew with each
    replay even where the recorded calls passed the same one: a setting a scheduler changes
    later flows from the first recipe. (Inside the optimizer's step only: its numbers are
    its settings' arithmetic, where a model's own constant, a dropout's p of 0.1, could have
    a learning rate's value.)"""
    out: dict = {}
    if not ledger or not spans:
        return out
    inside = {i for start, end in spans for i in range(start, len(instrs) if end is None else end)}
    no_settings, no_reads = steered(steer)
    j = 0
    for i, ins in enumerate(instrs):
        if ins.code == _OP and i in inside:
            for path, v in _floats(ins):
                exprs = tuple(
                    e
                    for e in ledger.get(v, ())
                    if not settings_in(e) & no_settings and not reads_in(e) & no_reads
                )
                if exprs:
                    out[(j, path)] = exprs
        if ins.code in (_OP, _FREE):
            j += 1
    return out


def evaluate(expr, groups_: list, reads=()):
    """The value of ``expr`` with the settings in ``groups_`` and the values a call read
    from shadows (``reads``, see jit.program), computed as the optimizer computed it, so the
    same float."""
    kind = expr[0]
    if kind == "k":
        v = groups_[expr[1]][expr[2]]
        return float(v if expr[3] is None else v[expr[3]])
    if kind == "c":
        return expr[1]
    if kind == "r":
        return reads[expr[1]]
    if kind == "neg":
        return -evaluate(expr[1], groups_, reads)
    left, right = evaluate(expr[1], groups_, reads), evaluate(expr[2], groups_, reads)
    return getattr(operator, kind)(left, right)


def agree(exprs, groups_: list, reads=()):
    """The number every expression of ``exprs`` gives with the settings in ``groups_`` (and
    ``reads``); None where two differ or one cannot be computed (a replay then records
    instead)."""
    value = None
    for e in exprs:
        try:
            v = evaluate(e, groups_, reads)
        except (IndexError, KeyError, TypeError, ValueError, ArithmeticError):
            return None
        if value is None:
            value = v
        elif v != value:
            return None
    return value


def knobs(opts, flowing=frozenset(), settings: list | None = None, only=None) -> list:
    """The Python settings of ``opts``' param groups (lr, betas, weight decay...), but those
    ``flowing`` into the block as inputs ((group index, key)): what a replay compares. A
    host tensor setting (``lr=torch.tensor(0.01)`` made outside the capture) by its value:
    a scheduler fills it in place, and the same tensor object would compare equal.
    ``settings``: param groups as a recorded call began with them (default: as they are);
    ``only``: the (group index, key) that matter (None: all; see ``touched``)."""
    return [
        tuple(
            (k, _value(v))
            for k, v in group.items()
            if k not in _NOT_KNOBS
            and (i, k) not in flowing
            and (only is None or i in only[0] or (i, k) in only[1])
        )
        for i, group in enumerate(groups(opts) if settings is None else settings)
    ]


def touched(opts, recs) -> tuple | None:
    """The settings recorded calls ``recs`` could have used, as ``knobs``' ``only``: every
    setting of an optimizer whose step ran in one of them, and of the others those a number
    passed to an op came from or that steered Python (a comparison, a conversion, a host
    tensor made of it: see ``steered``). None where every optimizer stepped. A setting no
    call touched cannot be in the block: an optimizer the loop steps outside the step (the
    micro-batches' step accumulating) changes its lr without recording the step again."""
    ran = set().union(*(r.stepped for r in recs))
    owner = [id(opt) for opt in opts for _ in opt.param_groups]
    if all(o in ran for o in owner):
        return None
    whole = {i for i, o in enumerate(owner) if o in ran}
    used = set()
    for r in recs:
        used |= {s for es in r.knob_floats.values() for e in es for s in settings_in(e)}
        used |= set(r.steered[0])
    return whole, used


def _value(v):
    if isinstance(v, torch.Tensor) and not hasattr(v, "_gt_id") and v.numel() == 1:
        return ("tensor", v.item())  # (a host tensor: no sync)
    return v


def settings_in(expr) -> set:
    """The settings ``(group, key)`` that ``expr`` reads."""
    if expr[0] == "k":
        return {(expr[1], expr[2])}
    if expr[0] in ("c", "r"):
        return set()
    return set().union(*(settings_in(e) for e in expr[1:]))


def _floats(ins):
    return floats_in(ins.args, ins.kwargs)


def floats_in(args, kwargs):
    """(path, value) of each float among an op's arguments (a path as ``lift``'s)."""
    for i, a in enumerate(args):
        yield from _walk(a, (i,))
    for k, v in kwargs.items():
        yield from _walk(v, (k,))


def _walk(a, path):
    if type(a) is float:
        yield path, a
    elif type(a) is list or type(a) is tuple:
        for i, x in enumerate(a):
            yield from _walk(x, (*path, i))
