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
    each call), its bound self, its closure's cells and the globals it names."""
    roots = [(None, x) for x in leaves if not isinstance(x, (int, float, str, bool, type(None)))]
    f = getattr(fn, "__func__", fn)
    if getattr(fn, "__self__", None) is not None:
        roots.append((None, fn.__self__))
    code = getattr(f, "__code__", None)
    if code is not None:
        for cell in f.__closure__ or ():
            try:
                roots.append((("attr", cell, "cell_contents"), cell.cell_contents))
            except ValueError:  # a cell not yet bound
                pass
        g = f.__globals__
        roots += [(("item", g, n), g[n]) for n in sorted(_names(code)) if n in g]
    return [(place, obj) for place, obj in roots if not isinstance(obj, types.ModuleType)]


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
    if id(obj) in seen or depth > 3:
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
