"""Knobs: Python floats that remember how they were computed, while a jitted step records.

A :class:`Knob` is a float setting (an optimizer's ``lr``), a number of the step's own state
(``self.scale``), a value read from a small tensor, or a number computed from those through
arithmetic (``-lr``, ``1 - lr * weight_decay``); its ``expr`` says how. ``evaluate`` computes
an expression again from the settings as they are now (jit.settings gives them), as the
recorded call computed it: the same float.

What leaves a Knob (a comparison, ``int()``, ``float()``, ``math``'s functions) is not
followed: its expression is *steered*, and its outcome is a *test* (``failed`` checks that
the numbers now give the recorded call's outcome, so a replay takes the recorded path).
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import threading
import types

__all__ = [
    "Knob",
    "plain",
    "recording",
    "evaluate",
    "agree",
    "failed",
    "steered",
    "settings_in",
    "reads_in",
]

_here = threading.local()  # .ledger: {value: [expression]} of the call recording now
plain = float.__float__  # (a Knob's number as a plain float; float(knob) is a test)


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
            ledger.setdefault(plain(float(value)), []).append(expr)
        return k

    def __neg__(self):
        return Knob(-plain(self), ("neg", self.expr))

    def __reduce__(self):  # (pickled as the plain number it is)
        return (float, (plain(self),))


def _binary(name: str, reflected: bool):
    fn = getattr(operator, name)

    def method(self, other):
        if type(other) is Knob:
            right = other.expr
        elif type(other) is float or type(other) is int:
            right = ("c", other)
        else:
            return NotImplemented  # (a tensor: its own reflected method)
        a, b = (plain(other) if type(other) is Knob else other), plain(self)
        if reflected:
            return Knob(fn(a, b), (name, right, self.expr))
        return Knob(fn(b, a), (name, self.expr, right))

    return method


for _name in ("add", "sub", "mul", "truediv", "pow"):
    setattr(Knob, f"__{_name}__", _binary(_name, False))
    setattr(Knob, f"__r{_name}__", _binary(_name, True))


def _escaping(name: str):
    """A float method whose result is no Knob: a comparison, a truth value, an int, a
    rounding, a plain float. What the step does with it is not followed (a branch: ``if
    weight_decay != 0``), so the settings and reads it came from are ``steered``: they never
    flow by their origin alone (see ``steered``), only where they changed between the
    recorded calls; and its outcome is a test a replay checks (see ``failed``)."""
    fn = getattr(float, name)

    def method(self, *args):
        result = fn(self, *args)
        steered = getattr(_here, "steered", None)
        if steered is not None:
            steered.add(self.expr)
        tests = getattr(_here, "tests", None)
        if tests is not None and result is not NotImplemented:
            if all(type(a) in _PLAIN_NUMBERS or type(a) is Knob for a in args):
                other = tuple(a.expr if type(a) is Knob else ("c", a) for a in args)
                tests.append((name, self.expr, other, result))
            else:  # (against something not a number: its value must stay)
                tests.append(("__float__", self.expr, (), plain(self)))
        return result

    return method


_PLAIN_NUMBERS = (int, float, bool)
for _name in (
    "eq", "ne", "lt", "le", "gt", "ge", "bool", "int", "round", "trunc", "floor", "ceil",
    "abs", "pos", "mod", "rmod", "floordiv", "rfloordiv", "divmod", "rdivmod", "float",
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
            knobs_ = [a for a in (*args, *kwargs.values()) if type(a) is Knob]
            steered.update(a.expr for a in knobs_)
            tests = getattr(_here, "tests", None)
            if tests is not None:  # (its result is not followed: the numbers must stay)
                tests.extend(("__float__", a.expr, (), plain(a)) for a in knobs_)
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


@functools.lru_cache(maxsize=1 << 16)
def reads_in(expr) -> frozenset[int]:
    """The reads (their index j) that an expression uses. (Cached: a recorded call asks it
    of the same few expressions thousands of times, an optimizer's per parameter.)"""
    if expr[0] == "r":
        return frozenset((expr[1],))
    if expr[0] in ("k", "c"):
        return frozenset()
    return frozenset().union(*(reads_in(e) for e in expr[1:]))


def evaluate(expr, groups_: list, reads=()):
    """The value of ``expr`` with the settings in ``groups_`` and the values a call read
    from shadows (``reads``, see jit.program), computed as the optimizer computed it, so the
    same float."""
    kind = expr[0]
    if kind == "k":
        v = groups_[expr[1]][expr[2]]
        return plain(float(v if expr[3] is None else v[expr[3]]))
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


_SYMBOLS = {"__eq__": "==", "__ne__": "!=", "__lt__": "<", "__le__": "<=", "__gt__": ">",
            "__ge__": ">="}  # fmt: skip


def failed(tests, groups_: list, reads=()) -> str | None:
    """The first of a recorded call's ``tests`` (see ``_escaping``) whose outcome differs
    with the settings and numbers in ``groups_`` (and ``reads``), in words; None: all hold."""
    for name, expr, args, result in tests:
        try:
            v = evaluate(expr, groups_, reads)
            got = getattr(float, name)(v, *(evaluate(a, groups_, reads) for a in args))
        except (IndexError, KeyError, TypeError, ValueError, ArithmeticError) as exc:
            return f"a number the step tested cannot be read again ({exc})"
        if type(got) is not type(result) or got != result:
            if name == "__float__":
                return f"{result!r} -> {v!r}, read as a plain float, whose use is not followed"
            was = _SYMBOLS.get(name)
            other = [evaluate(a, groups_, reads) for a in args]
            test = f"{v!r} {was} {other[0]!r}" if was else f"{name.strip('_')}({v!r})"
            return f"{test} is {got!r} now, {result!r} when recorded"
    return None


@functools.lru_cache(maxsize=1 << 16)
def settings_in(expr) -> frozenset:
    """The settings ``(group, key)`` that ``expr`` reads (cached, as reads_in)."""
    if expr[0] == "k":
        return frozenset(((expr[1], expr[2]),))
    if expr[0] in ("c", "r"):
        return frozenset()
    return frozenset().union(*(settings_in(e) for e in expr[1:]))


@contextlib.contextmanager
def recording(ledger: dict, steered_: set | None, tests: list | None):
    """While a call records: Knobs made add their numbers to ``ledger``, those that leave
    add their expressions to ``steered_`` and their outcomes to ``tests`` (see _escaping)."""
    _here.ledger, _here.steered, _here.tests = ledger, steered_, tests
    try:
        with _watch_math() if steered_ is not None else contextlib.nullcontext():
            yield
    finally:
        _here.ledger, _here.steered, _here.tests = None, None, None
