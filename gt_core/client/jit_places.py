"""Places: where a jitted step's tensors live in the state it reaches.

A place is ``("attr", obj, name)`` or ``("item", container, key)``: a closure cell, a global,
a module's parameter or buffer, a tensor's ``.grad``, an optimizer's state, a list's item.
A replayed call reads the block's inputs from places and writes its outputs back to them.
"""

from __future__ import annotations

import types

import torch

from gt_core.client.proxy import Proxy


def _roots(fn, leaves) -> list:
    """[(place or None, object)] the step can reach: its arguments (no place: they come with
    each call), its bound self, its closure's cells and the globals it names, and those of
    the Python functions found there (the helpers a step calls: ``forward(x)`` reading a
    global model), to a depth of ``_HELPERS``; torch's own functions are not followed."""
    roots = [(None, x) for x in leaves if not isinstance(x, (int, float, str, bool, type(None)))]
    if getattr(fn, "__self__", None) is not None:
        roots.append((None, fn.__self__))
    _reach(getattr(fn, "__func__", fn), roots, set(), set(), 0)
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
            found.append((("attr", cell, "cell_contents"), cell.cell_contents))
        except ValueError:  # a cell not yet bound
            pass
    g = f.__globals__
    found += [(("item", g, n), g[n]) for n in sorted(_names(code)) if n in g]
    for place, obj in found:
        if _pid(place) not in places:
            places.add(_pid(place))
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


def _scan(roots) -> list:
    """[(place, proxy or None)] for every tensor slot reachable from ``roots``."""
    out: list = []
    seen: set[int] = set()
    for place, obj in roots:
        if isinstance(obj, Proxy):
            if place is not None:
                _slot(place, obj, out)
            _slot(("attr", obj, "grad"), obj.grad, out)
        else:
            _visit(obj, out, seen, 0)
    return out


def _visit(obj, out, seen, depth) -> None:
    if id(obj) in seen or depth > _NESTING:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        for m in obj.modules():
            for d in (m._parameters, m._buffers):
                for name, t in d.items():
                    _slot(("item", d, name), t, out)
                    if t is not None and isinstance(t, Proxy):
                        _slot(("attr", t, "grad"), t.grad, out)
    elif isinstance(obj, torch.optim.Optimizer):
        for group in obj.param_groups:
            _visit(group, out, seen, depth + 1)
            for p in group["params"]:
                if isinstance(p, Proxy):
                    _slot(("attr", p, "grad"), p.grad, out)
        for st in obj.state.values():
            _visit(st, out, seen, depth + 1)
    elif isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        _visit(obj.optimizer, out, seen, depth + 1)
    elif isinstance(obj, dict):
        for k, v in list(obj.items()):
            if isinstance(v, torch.Tensor):
                _slot(("item", obj, k), v, out)
            elif isinstance(v, (dict, list, tuple, torch.nn.Module, torch.optim.Optimizer)):
                _visit(v, out, seen, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            if isinstance(v, torch.Tensor):
                if type(obj) is list:  # (a tuple's tensors cannot be put back: no place)
                    _slot(("item", obj, i), v, out)
            elif isinstance(v, (dict, list, tuple, torch.nn.Module, torch.optim.Optimizer)):
                _visit(v, out, seen, depth + 1)


def _slot(place, t, out) -> None:
    if t is None or isinstance(t, Proxy):
        out.append((place, t))


def _pid(place) -> tuple:
    return (place[0], id(place[1]), place[2] if len(place) > 2 else None)


def _before_id(before, key):
    for place, p in before:
        if _pid(place) == key:
            return p._gt_id if p is not None else None
    return None


def _read(place):
    try:
        if place[0] == "item":
            return place[1][place[2]]
        return getattr(place[1], place[2])
    except (KeyError, IndexError, AttributeError, ValueError):
        return None


def _write(place, value) -> None:
    if place[0] == "item":
        place[1][place[2]] = value
    else:
        setattr(place[1], place[2], value)


def _words(place) -> str:
    if place[0] == "attr":
        if isinstance(place[1], torch.Tensor):
            return f"the .{place[2]} of a tensor {list(place[1].shape)}"
        return f"the closure variable ({place[2]})"
    return f"entry {place[2]!r} of a {type(place[1]).__name__}"
