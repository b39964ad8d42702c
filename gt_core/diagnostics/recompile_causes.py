"""Every cause of a recompile: each failing guard of each cache entry a call missed.

Dynamo's recompile reason names the first failing guard of each entry only, so a shape and
a dtype that change together read as the dtype alone. Here each entry's guard tree is walked
against the new call's locals, one leaf guard at a time, and every leaf that fails is
described: the input it guards, the field (``size[0]``, ``dtype``, ``grad_mode``), the value
the entry was compiled for and the value of this call. A cause is named only for a leaf that
fails: one that passes, or that cannot be checked alone, names nothing.
"""

from __future__ import annotations

import json
import re

from gt_core.diagnostics import torch_hooks as hooks
from gt_core.diagnostics.names import innermost_user, user_call

__all__ = ["causes_of", "input_name"]

# A guard's code part: the check, then ``# <user source>  # <file tail>:<line> in <fn>``.
_READ_AT = re.compile(r"#\s*(?P<src>.*?)\s+#\s*(?P<file>\S+):(?P<line>\d+) in \S+")
_TENSOR = re.compile(
    r"torch\.(?P<dtype>\w+), device=(?P<device>\w+), requires_grad=(?P<grad>True|False), "
    r"size=\[(?P<size>[^\]]*)\], stride=\[(?P<stride>[^\]]*)\]"
)
_EQUALS = re.compile(r"==\s*(?P<value>.+?)\s*(?:#|$)")
_TYPE = re.compile(r"type=<class '(?P<type>[^']+)'>")
_SOURCE = re.compile(r"[LG]\['[^']+'\](?:\.\w+\b(?!\()|\[[^\]]+\])*")
_PROPERTY = re.compile(
    r"(?P<src>[LG]\['[^']+'\](?:\.\w+\b(?!\()|\[[^\]]+\])*)\.(?P<prop>size|stride)\(\)\[(?P<dim>\d+)\]"
)
_VALUE_MATCH = ("EQUALS_MATCH", "TRUE_MATCH", "FALSE_MATCH")  # a value's ``==`` guards
_MODULE_PART = re.compile(r"\._(?:modules|parameters|buffers)\['(\w+)'\]")


def input_name(source: str) -> str:
    """The user's name of a guarded value: ``L['x']`` -> ``x``,
    ``L['self']._modules['lin']._parameters['weight']`` -> ``self.lin.weight``."""
    name = re.sub(r"\b[LG]\['(\w+)'\]", r"\1", source)
    return _MODULE_PART.sub(r".\1", name)


def _check_text(part: str) -> str:
    """A code part's check alone (no comment), in the user's names."""
    return input_name(part.split("#", 1)[0].strip())


def _read_at(part: str, filename: str) -> str:
    """``file:line: source`` where the guarded value was read, as torch gives it (its file
    named in full where it is the compiled frame's own)."""
    m = _READ_AT.search(part)
    if m is None:
        return ""
    file = filename if filename.endswith(m["file"]) else m["file"]
    return f"{file}:{m['line']}: {m['src']}"


def _cause(name: str, field: str, before, after, check: str = "") -> dict:
    return {"input": name, "field": field, "before": before, "after": after, "check": check}


def _dims(text: str) -> list:
    return [None if d.strip() == "None" else int(d) for d in text.split(",") if d.strip()]


def _tensor(name: str, part: str, value) -> list[dict]:
    """The fields of a tensor that differ from those its ``TENSOR_MATCH`` guard recorded:
    size (per dim), dtype, device, requires_grad, strides where the sizes agree."""
    m = _TENSOR.search(part)
    if m is None or not hasattr(value, "dtype"):
        return []
    out = []
    if str(value.dtype).removeprefix("torch.") != m["dtype"]:
        out.append(_cause(name, "dtype", m["dtype"], str(value.dtype).removeprefix("torch.")))
    index = None if m["device"] == "None" else int(m["device"])
    if value.device.index != index:
        out.append(_cause(name, "device", "cpu" if index is None else index, str(value.device)))
    if str(value.requires_grad) != m["grad"]:
        out.append(_cause(name, "requires_grad", m["grad"] == "True", value.requires_grad))
    out += _dims_changed(name, "size", _dims(m["size"]), list(value.shape))
    if not any(c["field"].startswith("size") for c in out):
        out += _dims_changed(name, "stride", _dims(m["stride"]), list(value.stride()))
    return out


def _dims_changed(name: str, field: str, expected: list, actual: list) -> list[dict]:
    if len(expected) != len(actual):
        return [_cause(name, field, expected, actual)]
    return [
        _cause(name, f"{field}[{i}]", e, a)
        for i, (e, a) in enumerate(zip(expected, actual, strict=True))
        if e is not None and e != a
    ]


def _global_state(part: str) -> list[dict]:
    """Each field of the global state (grad mode, autocast, default dtype...) that differs
    from the one the entry was compiled under."""
    then = json.loads(part.split(" against ", 1)[1])
    now = json.loads(hooks.global_state_now())
    return [_cause(k, "", then[k], now.get(k)) for k in then if then[k] != now.get(k)]


class _Walk:
    """One cache entry's guards, checked one leaf at a time against a call's locals.

    ``first``: the first failing guard as Dynamo reports it (its code parts, the user stack
    where the value was read): the one guard torch keeps a stack for, whose read is named at
    the user's own line (a torch.nn module's attribute is read inside torch, called from
    the user's forward)."""

    def __init__(self, tree, filename: str, first: tuple[list, list]):
        self.root, self.globals, self.scope = tree
        self.filename = filename
        self.first = first
        self.causes: list[dict] = []

    def value_of(self, source: str):
        return eval(source, self.globals, self.scope)  # the guard's own source text

    def visit(self, manager, value, source: str, root: bool = False) -> None:
        for kind, leaf, parts in hooks.leaf_guards(manager, root=root):
            if parts and hooks.leaf_passes(leaf, value) is False:
                for c in self.describe(kind, parts, value, source):
                    c["guard"], c["source"] = kind, source
                    if not c.get("read_at"):
                        c["read_at"] = self.read_at(parts)
                    self.causes.append(c)
        for child_source, child in hooks.guard_children(manager):
            try:
                child_value = self.value_of(child_source)
            except Exception:  # a value this call lacks: its parent's guard names it
                continue
            self.visit(child, child_value, child_source)

    def read_at(self, parts: list[str]) -> str:
        first_parts, stack = self.first
        user = innermost_user(stack) if parts == first_parts else None
        if user is not None:
            return f"{user[0]}:{user[1]}: {user[2]}"
        return _read_at(parts[0], self.filename)

    def describe(self, kind: str, parts: list[str], value, source: str) -> list[dict]:
        name = input_name(source) if source != "L" else "global"
        if kind == "TENSOR_MATCH":
            found = _tensor(name, parts[0], value)
        elif kind in _VALUE_MATCH and _EQUALS.search(parts[0]):
            found = [_cause(name, "", _EQUALS.search(parts[0])["value"], repr(value))]
        elif kind == "TYPE_MATCH" and _TYPE.search(parts[0]):
            found = [_cause(name, "type", _TYPE.search(parts[0])["type"], type(value).__name__)]
        elif kind == "GLOBAL_STATE" and " against " in parts[0]:
            found = _global_state(parts[0])
        else:
            found = []
        return found or self.failing_parts(parts, name)

    def failing_parts(self, parts: list[str], name: str) -> list[dict]:
        """The code parts of a leaf that fail on their own (a shape guard holds many), each
        as a check; the value it reads where it reads one tensor property."""
        out = []
        for part in parts:
            try:
                if self.value_of(part) is not False:
                    continue
            except Exception:
                continue
            prop, source = _PROPERTY.search(part), _SOURCE.search(part)
            who = input_name(source[0]) if source else name
            if prop:
                after = self.value_of(f"{prop['src']}.{prop['prop']}()[{prop['dim']}]")
                out.append(_cause(who, f"{prop['prop']}[{prop['dim']}]", None, after))
            else:
                out.append(_cause(who, "", None, None))
            out[-1]["check"] = _check_text(part)
            out[-1]["read_at"] = _read_at(part, self.filename)  # (each part has its own)
        return out


def causes_of(cache_entries, frame) -> list[dict]:
    """Every failing guard of each cache entry a call missed, newest entry first: ``{entry,
    input, field, before, after, check, guard, source, line, code, read_at}``; ``guard``: the
    kind of leaf guard (``TENSOR_MATCH``), ``source``: the guarded value as the guard reads
    it (``G['n']``), ``line``/``code``: the user's call of the compiled function,
    ``read_at``: where the guarded value was read, at the user's line where torch knows it."""
    line, code = user_call()
    filename = frame.f_code.co_filename
    out = []
    for entry in cache_entries:
        try:
            tree = hooks.guard_scope(entry, frame.f_locals)
            if tree is None:
                continue
            try:
                first = hooks.first_failure(entry, frame.f_locals)
            except Exception:  # no stack: each read is named where the guard's comment says
                first = ([], [])
            walk = _Walk(tree, filename, first)
            walk.visit(walk.root, frame.f_locals, "L", root=True)
        except Exception:  # a guard tree this torch shapes otherwise: the reason alone
            continue
        for c in walk.causes:
            c.update(entry=str(entry.compile_id), line=line, code=code)
            out.append(c)
    return out
