"""Python numbers that flow into a replayed block: a learning rate a scheduler changes.

While a jitted step records, each float setting of its optimizers' param groups (``lr``,
``weight_decay``, the ``betas``...) is a :class:`Knob`: a float that remembers how it was
computed from the settings, through the arithmetic an optimizer does with it (``-lr``,
``1 - lr * weight_decay``). The numbers the recorded call passed to ops are then attributed
to those expressions by value (``attribute``). Where two recorded calls passed different
numbers at the same place (the worker lifts those into inputs of the block), and both are
the same expression of their calls' settings, a replayed call computes that expression from
the settings as they are now and sends it with the RUN (``knob.evaluate``). A number that
changed and is no such expression refuses replay, as before.

The float numbers the step reaches in its own state (``lr[0]`` of a hand-written update, a
trainer's ``self.scale``, a global) are Knobs too while it records, as one more group of
settings after the optimizers' (a :class:`Numbers`: keyed by the place's identity): a
number computed from one flows where two recorded calls passed different ones, as a
setting's does.

What a Knob's value decides in Python (``if lr > 0.1``, ``int(warmup * ratio)``) is a
*test*: the recorded call's outcome of it, which a replay checks with the numbers as they
are now (``knob.failed``); another outcome would take another path, so the call records.
"""

from __future__ import annotations

import contextlib

import torch

from gt_core.client.jit.knob import (
    Knob,
    plain,
    reads_in,
    recording,
    settings_in,
    steered,
)
from gt_core.client.jit.reach import Place
from gt_core.stream.instructions import FREE as _FREE
from gt_core.stream.instructions import OP as _OP

__all__ = [
    "Numbers",
    "numbers_at",
    "live",
    "floats_in",
    "wrapped",
    "attribute",
    "groups",
    "knobs",
    "touched",
    "by_origin",
]

_NOT_KNOBS = ("params", "capturable")  # (capturable: set while recording, see traced)


def groups(opts) -> list:
    """The param groups of ``opts``, in the order expressions number them."""
    return [g for opt in opts for g in opt.param_groups]


class Numbers(dict):
    """The float numbers a step reaches in its state, {place's identity: value}: the group
    of settings after the optimizers' param groups (see the module's docstring)."""


def numbers_at(scalars) -> dict:
    """{identity: place} of the float numbers among ``scalars`` (a walk's: see reach) that
    are the step's own: not an LR scheduler's (its arithmetic reaches the step as settings)."""
    out = {}
    for place, v in scalars:
        if type(v) is float and not isinstance(place.obj, _NOT_OWN):
            out.setdefault(place.ident(), place)
    return out


_NOT_OWN = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


class _Live:
    """The numbers at their places as they are now (a Numbers read on demand)."""

    __slots__ = ("places",)

    def __init__(self, places: dict):
        self.places = places

    def __getitem__(self, ident):
        v = self.places[ident].read()
        if type(v) is not float:
            raise TypeError(f"no longer a float: {v!r}")
        return v


def live(opts, places: dict) -> list:
    """The settings of ``opts`` and the numbers at ``places`` now, as a recorded call's
    ``settings`` list (what ``evaluate`` reads)."""
    now = list(groups(opts))
    if places:
        now.append(_Live(places))
    return now


@contextlib.contextmanager
def wrapped(opts, ledger: dict, steered_: set | None = None, places=None, tests=None):
    """The float settings of ``opts`` (and the numbers at ``places``, {identity: place}) as
    Knobs while the step records (``ledger`` collects the numbers computed from them,
    ``steered_`` the expressions that left them, ``tests`` their outcomes: see
    jit.knob); each is put back after, unless the step replaced it."""
    with recording(ledger, steered_, tests):  # (first: the Knobs' own numbers are ledgered)
        put = []
        for gi, group in enumerate(groups(opts)):
            for key, v in list(group.items()):
                if type(v) is float:
                    knob = Knob(v, ("k", gi, key, None))
                elif type(v) is tuple and v and all(type(x) is float for x in v):
                    knob = tuple(Knob(x, ("k", gi, key, i)) for i, x in enumerate(v))
                else:
                    continue
                put.append((Place("item", group, key), v, knob))
        numbers = len(groups(opts))
        for ident, place in (places or {}).items():
            v = place.read()
            if type(v) is float:
                put.append((place, v, Knob(v, ("k", numbers, ident, None))))
        for place, _, knob in put:
            place.write(knob)
        try:
            yield
        finally:
            for place, v, knob in put:
                _put_back(place, v, knob)


def _put_back(place, v, knob) -> None:
    """``v`` where ``knob`` was, unless the step replaced it: then its number, plain."""
    now = place.read()
    if now is knob:
        place.write(v)
    elif type(now) is Knob:  # (the step wrote a number computed from a setting)
        place.write(plain(now))
    elif type(now) is tuple and any(type(x) is Knob for x in now):
        place.write(tuple(plain(x) if type(x) is Knob else x for x in now))


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
    kept: dict = {}  # value -> its expressions kept (an optimizer passes one lr to every op)
    j = 0
    for i, ins in enumerate(instrs):
        if ins.code == _OP and i in inside:
            for path, v in _floats(ins):
                exprs = kept.get(v)
                if exprs is None:
                    exprs = kept[v] = tuple(
                        e
                        for e in ledger.get(v, ())
                        if not settings_in(e) & no_settings and not reads_in(e) & no_reads
                    )
                if exprs:
                    out[(j, path)] = exprs
        if ins.code in (_OP, _FREE):
            j += 1
    return out


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
        if type(group) is not Numbers
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
    if isinstance(v, torch.Tensor) and not hasattr(v, "gt_value_id") and v.numel() == 1:
        return ("tensor", v.item())  # (a host tensor: no sync)
    return v


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
