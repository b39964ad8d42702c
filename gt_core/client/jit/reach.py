"""Places: where a jitted step's tensors live in the state it reaches.

A :class:`Place` is an attribute ``("attr", obj, name)`` or an item ``("item", container,
key)``: a closure cell, a global, a module's parameter or buffer, a tensor's ``.grad``, an
optimizer's state, a list's item.
A replayed call reads the block's inputs from places and writes its outputs back to them.
"""

from __future__ import annotations

import operator
import types
from typing import Any, NamedTuple

import torch

from gt_core.client.recording.proxy import Proxy

__all__ = ["Place", "Reached", "reach_roots", "walk", "tensor_slots", "ids_by_place"]


class Place(NamedTuple):
    """Where a tensor lives: ``getattr(obj, key)`` ("attr"), ``obj[key]`` ("item"), or item
    ``key`` of the tuple at Place ``obj`` ("elem": an LSTM's hidden state in a global; it is
    written by making the tuple anew, as the step did)."""

    how: str
    obj: Any
    key: Any

    def read(self):
        """What is there now (None: nothing, or the place is gone)."""
        try:
            if self.how == "elem":
                return self.obj.read()[self.key]
            return self.obj[self.key] if self.how == "item" else getattr(self.obj, self.key)
        except (KeyError, IndexError, AttributeError, ValueError, TypeError):
            return None

    def write(self, value) -> None:
        if self.how == "elem":
            t = self.obj.read()
            items = [*t[: self.key], value, *t[self.key + 1 :]]
            self.obj.write(type(t)._make(items) if hasattr(t, "_make") else tuple(items))
        elif self.how == "item":
            self.obj[self.key] = value
        else:
            setattr(self.obj, self.key, value)

    def reader(self) -> tuple:
        """(getter, obj, key): ``getter(obj, key)`` reads it with no check (the fast path's
        flat reads; a missing place raises)."""
        if self.how == "elem":
            return (_elem, self.obj.reader(), self.key)
        return (operator.getitem if self.how == "item" else getattr, self.obj, self.key)

    def ident(self) -> tuple:
        """The place by its container's identity (equal for two Places of one slot)."""
        if self.how == "elem":
            return (self.how, self.obj.ident(), self.key)
        return (self.how, id(self.obj), self.key)

    def describe(self) -> str:
        """The place in words, for a refusal or an unfit input."""
        if self.how == "elem":
            return f"item {self.key} of the tuple at {self.obj.describe()}"
        if self.how == "attr":
            if isinstance(self.obj, torch.Tensor):
                return f"the .{self.key} of a tensor {list(self.obj.shape)}"
            if isinstance(self.obj, types.CellType):
                return f"the closure variable ({self.key})"
            return f"attribute .{self.key} of a {type(self.obj).__name__}"
        return f"entry {self.key!r} of a {type(self.obj).__name__}"


def _elem(parent: tuple, i: int):
    """Item ``i`` of the tuple that ``parent`` (a reader) reads."""
    get, obj, key = parent
    return get(obj, key)[i]


def reach_roots(fn, leaves) -> list:
    """[(place or None, object)] the step can reach: its arguments (no place: they come with
    each call), its bound self (or the callable object itself, a module, and its forward),
    its closure's cells and the globals it names, and those of
    the Python functions found there (the helpers a step calls: ``forward(x)`` reading a
    global model), to a depth of ``_HELPERS``; torch's own functions are not followed."""
    roots = [(None, x) for x in leaves if not isinstance(x, (int, float, str, bool, type(None)))]
    if getattr(fn, "__self__", None) is not None:
        roots.append((None, fn.__self__))
    f = getattr(fn, "__func__", fn)
    if not hasattr(f, "__code__"):  # a callable object (a jitted nn.Module): it, and its code
        roots.append((None, fn))
        f = getattr(type(fn), "forward", None) or type(fn).__call__
    _reach(f, roots, set(), set(), 0)
    return [(place, obj) for place, obj in roots if not isinstance(obj, types.ModuleType)]


_HELPERS = 3  # levels of helper functions followed from the step
_NESTING = 3  # levels of containers (dicts, lists, modules) searched below a root


def _reach(f, roots: list, funcs: set, places: set, depth: int) -> None:
    """Add the closure cells and named globals of function ``f`` (and of its helpers)."""
    code = getattr(f, "__code__", None)
    if code is None or id(f) in funcs:
        return
    funcs.add(id(f))
    found = []
    for cell in f.__closure__ or ():
        try:
            found.append((Place("attr", cell, "cell_contents"), cell.cell_contents))
        except ValueError:  # a cell not yet bound
            pass
    g = f.__globals__
    found += [(Place("item", g, n), g[n]) for n in sorted(_names(code)) if n in g]
    for place, obj in found:
        if place.ident() not in places:
            places.add(place.ident())
            roots.append((place, obj))
    if depth < _HELPERS:
        for _, obj in found:
            if isinstance(obj, types.FunctionType) and not _library(obj):
                _reach(obj, roots, funcs, places, depth + 1)


def _library(f) -> bool:
    """torch's functions (F.mse_loss, imported by name): their globals hold no user state."""
    module = getattr(f, "__module__", None) or ""
    return module == "torch" or module.startswith("torch.")


def _names(code) -> set:
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


class Reached(NamedTuple):
    """What one walk over a step's state found: every tensor slot, every optimizer."""

    slots: list  # [(place, proxy or None)]
    optimizers: list  # the optimizers, once each, in the order found
    scalars: list  # [(place, Python number or bool)]: what a replay may have to compare
    schedulers: list  # the LR schedulers, once each
    holders: list  # [(place, container)]: where each container of the slots was found


def walk(roots) -> Reached:
    """The one walk over what a step reaches (``roots``: see reach_roots), through tensors,
    modules, optimizers, LR schedulers, dicts, lists, tuples and plain objects' attributes.
    Everything jit needs of the state (tensors read and written, settings compared or
    flowing) comes from here, so no setting is reachable for one purpose and not another."""
    out = Reached([], [], [], [], [])
    seen: set[int] = set()
    for place, obj in roots:
        if isinstance(obj, Proxy):
            if place is not None:
                _slot(place, obj, out.slots)
            _slot(Place("attr", obj, "grad"), obj.grad, out.slots)
        elif type(obj) in _NUMBERS:
            if place is not None:  # (a global or closure number; arguments are the key's)
                out.scalars.append((place, obj))
        else:
            _visit(obj, out, seen, 0, place=place)
    return out


def tensor_slots(roots) -> list:
    """[(place, proxy or None)] for every tensor slot reachable from ``roots``."""
    return walk(roots).slots


def _visit(obj, found: Reached, seen, depth, numbers: bool = True, place=None) -> None:
    """Add what ``obj`` holds to ``found`` (``numbers``: its Python numbers too; not a param
    group's, which are settings: see jit.settings); ``place``: where ``obj`` is (a tuple's
    tensors are places through it)."""
    if id(obj) in seen or depth > _NESTING:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        _visit_module(obj, found, seen, depth)
    elif isinstance(obj, torch.optim.Optimizer):
        found.optimizers.append(obj)
        found.holders.append((Place("attr", obj, "param_groups"), obj.param_groups))
        found.holders.append((Place("attr", obj, "state"), obj.state))
        for i, group in enumerate(obj.param_groups):
            found.holders.append((Place("item", obj.param_groups, i), group))
            _visit(group, found, seen, depth + 1, numbers=False)
            for p in group["params"]:
                if isinstance(p, Proxy):
                    _slot(Place("attr", p, "grad"), p.grad, found.slots)
        for key, st in list(obj.state.items()):
            found.holders.append((Place("item", obj.state, key), st))
            _visit(st, found, seen, depth + 1)
    elif isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        found.schedulers.append(obj)
        found.scalars.append((Place("attr", obj, "last_epoch"), obj.last_epoch))
        _visit(obj.optimizer, found, seen, depth + 1)
    elif isinstance(obj, dict):
        for k, v in list(obj.items()):
            _visit_value(v, Place("item", obj, k), found, seen, depth, numbers)
    elif isinstance(obj, (list, tuple)):
        _visit_sequence(obj, found, seen, depth, place)
    elif _plain(obj):  # a library's state object (a KV cache and its layers): its attributes
        for k, v in list(vars(obj).items()):
            _visit_value(v, Place("attr", obj, k), found, seen, depth, True)


def _visit_module(obj, found: Reached, seen, depth) -> None:
    """A module's parameters and buffers (and their grads), each submodule's ``training``
    flag and Python numbers, and what its other attributes hold (its optimizer)."""
    out = found.slots
    for m in obj.modules():
        found.scalars.append((Place("attr", m, "training"), m.training))
        found.holders.extend((Place("item", m._modules, k), c) for k, c in m._modules.items())
        for d in (m._parameters, m._buffers):
            for name, t in d.items():
                _slot(Place("item", d, name), t, out)
                if t is not None and isinstance(t, Proxy):
                    _slot(Place("attr", t, "grad"), t.grad, out)
        for k, v in vars(m).items():
            if k.startswith("_") or k == "training" or isinstance(v, torch.nn.Module):
                continue
            _visit_value(v, Place("attr", m, k), found, seen, depth, True)


def _visit_value(v, place: Place, found: Reached, seen, depth, numbers: bool) -> None:
    """One value in a container: a tensor slot, a Python number, or what it holds."""
    if isinstance(v, torch.Tensor):
        _slot(place, v, found.slots)
    elif numbers and type(v) in _NUMBERS:
        found.scalars.append((place, v))
    elif _holder(v):
        n = len(found.slots)
        _visit(v, found, seen, depth + 1, place=place)
        # (a container on the way to a tensor: a replay checks it is there; not a tuple, whose
        # tensors are places through its own, and which a step makes anew: an LSTM's state)
        if len(found.slots) > n and not isinstance(v, tuple):
            found.holders.append((place, v))


def _visit_sequence(obj, found: Reached, seen, depth, place) -> None:
    """A list's items are places; a tuple's are places through the tuple's own (``elem``)."""
    for i, v in enumerate(obj):
        if type(obj) is list:
            _visit_value(v, Place("item", obj, i), found, seen, depth, True)
        elif isinstance(v, torch.Tensor):
            if place is not None:  # (put back by making the tuple anew)
                _slot(Place("elem", place, i), v, found.slots)
        elif _holder(v):
            _visit(v, found, seen, depth + 1)


_NUMBERS = (int, float, bool)  # (exact types: a Knob is a setting, never one of these)
_NOT_PLAIN = (type, types.FunctionType, types.MethodType, types.ModuleType, torch.Tensor)


def _plain(obj) -> bool:
    """An instance of a Python class keeping its state in attributes (not a function,
    class, module or tensor, nor one of gt's own: a jitted function, a session)."""
    return (
        hasattr(obj, "__dict__")
        and not isinstance(obj, _NOT_PLAIN)
        and not type(obj).__module__.startswith("gt_core.")
    )


def _holder(v) -> bool:
    """Whether ``v`` may hold tensors a step reads: containers, modules, optimizers, and
    plain objects."""
    kinds = (dict, list, tuple, torch.nn.Module, torch.optim.Optimizer)
    return isinstance(v, kinds) or _plain(v)


def _slot(place, t, out) -> None:
    if t is None or isinstance(t, Proxy):
        out.append((place, t))


def ids_by_place(slots) -> dict:
    """{place's ident: the value id its slot held} of ``slots`` (None: empty); the first
    slot of a place where ``slots`` has it twice."""
    out: dict = {}
    for place, p in slots:
        out.setdefault(place.ident(), p.gt_value_id if p is not None else None)
    return out
