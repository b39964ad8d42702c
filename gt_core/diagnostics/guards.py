"""``explain(fn)``: a torch.compile'd function's cache entries and their guards, as text.

Dynamo keeps one cache entry per compile on the code object it compiled (and on the resume
functions it made at graph breaks); each entry holds the guards that decide whether a call
may reuse it. This module reads them through :mod:`.torch_hooks`.
"""

from __future__ import annotations

import re

from gt_core.diagnostics import torch_hooks as hooks
from gt_core.diagnostics.compiled import codes_of

__all__ = ["explain", "entries_of"]

# Guard-tree lines that only give structure (which object a guard reads), not a check.
_STRUCTURE = re.compile(r"^\s*(?:\|\s*)*\+- (?:\w*GuardManager|GuardManager)\b")


def _resolve(fn_or_name, frame):
    if not isinstance(fn_or_name, str):
        return fn_or_name
    for scope in (frame.f_locals, frame.f_globals, __import__("__main__").__dict__):
        obj = scope
        for i, part in enumerate(fn_or_name.split(".")):
            obj = obj.get(part) if i == 0 and isinstance(obj, dict) else getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None:
            return obj
    raise NameError(f"gt_core.diagnostics.explain: no function named {fn_or_name!r} in scope")


def _with_resumes(codes: list) -> list:
    """The codes and every resume function Dynamo generated from them (graph breaks)."""
    out, todo = [], list(codes)
    while todo:
        code = todo.pop(0)
        if code in out:
            continue
        out.append(code)
        try:
            todo.extend(hooks.resume_codes(code))
        except Exception:  # this torch keeps them elsewhere: the codes alone
            pass
    return out


# Guards every compile has (grad mode, autocast, dynamic-dim markers): counted, not listed.
_AMBIENT = re.compile(
    r"^(?:LAMBDA_GUARD: torch\._functorch|GLOBAL_STATE|TORCH_FUNCTION_MODE_STACK|DEFAULT_DEVICE|"
    r"DIMENSION_DYNAMIC_MARKING_GUARD|NO_TENSOR_ALIASING)"
)
_WIDTH = 160


def _guards(entry) -> list[str]:
    text = str(entry.guard_manager)
    lines = [ln for ln in text.splitlines() if "+- " in ln and not _STRUCTURE.match(ln)]
    return [re.sub(r"^[\s|]*\+- ", "", ln).rstrip() for ln in lines]


# A tensor guard's dispatch keys: the same for every entry of one function (its device's),
# and long enough to push the sizes and strides that tell entries apart past any width.
_KEYS = re.compile(r"DispatchKeySet\([^)]*\),\s*")


def _short(guard: str) -> str:
    """A guard as one line: a tensor's check whole, without its dispatch keys (its sizes,
    strides, dtype and grad mode are what tell entries apart); another cut at _WIDTH."""
    guard = re.sub(r"\s{2,}#", "  #", guard)
    if "check_tensor(" in guard or "TENSOR_MATCH" in guard:
        return _KEYS.sub("", guard)
    return guard if len(guard) <= _WIDTH else guard[: _WIDTH - 1] + "…"


def _entry_lines(entries) -> list[str]:
    """Guards all entries share (listed once), then what each entry checks on its own."""
    guards = [_guards(e) for e in entries]
    shared = set(guards[0]).intersection(*guards[1:]) if len(guards) > 1 else set()
    common = [g for g in guards[0] if g in shared and not _AMBIENT.match(g)]
    lines = []
    if common:
        lines.append(f"  guards shared by all {len(entries)} entries:")
        lines.extend(f"    {_short(g)}" for g in common)
    for entry, gs in zip(entries, guards, strict=True):
        own = [g for g in gs if g not in shared and not _AMBIENT.match(g)]
        ambient = sum(1 for g in gs if _AMBIENT.match(g))
        label = "its own guards" if shared else "guards"
        lines.append(
            f"  entry {entry.compile_id}: {len(gs)} guards ({ambient} on global state and "
            f"dimension markers){f', {label}:' if own else ''}"
        )
        lines.extend(f"    {_short(g)}" for g in own)
    return lines


def entries_of(codes: list) -> list[dict]:
    """{compile_id, code, guards} of each cache entry of ``codes`` (a compiled function's:
    :func:`~gt_core.diagnostics.compiled.codes_of`) and their resume functions, each with its own guards whole (not those
    on global state)."""
    out = []
    for code in _with_resumes(codes):
        for e in hooks.cache_entries(code):
            guards = [g for g in _guards(e) if not _AMBIENT.match(g)]
            out.append({"compile_id": str(e.compile_id), "code": code.co_name, "guards": guards})
    return out


def explain(fn_or_name, frame) -> str:
    """The text of ``gt_core.diagnostics.explain`` (``frame``: where a name is looked up)."""
    obj = _resolve(fn_or_name, frame)
    name, codes = codes_of(obj)
    lines, total = [], 0
    for code in _with_resumes(codes):
        entries = hooks.cache_entries(code)
        if not entries:
            continue
        total += len(entries)
        n = len(entries)
        lines.append(
            f"{code.co_name} ({code.co_filename}:{code.co_firstlineno}): "
            f"{n} cache entr{'y' if n == 1 else 'ies'}, newest first"
        )
        lines.extend(_entry_lines(entries))
    if not total:
        return (
            f"{name}: no cache entries (not called since it was compiled, compiled functions were "
            "reset, or not a torch.compile'd function)"
        )
    head = (
        f"{name}: {total} cache entr{'y' if total == 1 else 'ies'}; Dynamo falls back to eager "
        f"after {hooks.recompile_limit()} per code object (torch._dynamo.config.recompile_limit)"
    )
    return "\n".join([head, *lines])
