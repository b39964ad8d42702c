"""A recompile's causes as text: every failing guard of the cache entries a call missed
(``causes`` on ``user.recompile``, found by gt_core.diagnostics.recompile_causes), one
line each, and worded as Dynamo words a guard failure so that the catalogue explains each.

Pure (no torch), like the report that shows them.
"""

from __future__ import annotations

import re

__all__ = ["cause_lines", "cause_reasons", "cause_text"]


def cause_text(c: dict) -> str:
    """One failing guard as one line: ``x: size[0] 8 -> 16``, ``grad_mode: True -> False``;
    a guard that is a condition rather than a recorded value: the check that failed."""
    field = f" {c['field']}" if c.get("field") else ""
    if c.get("check"):
        now = f" is {c['after']}," if c.get("after") is not None else ""
        return f"{c['input']}:{field}{now} fails {c['check']}"
    return f"{c['input']}:{field} {c['before']} -> {c['after']}"


def cause_lines(recompile: dict) -> list[str]:
    """A recompile's causes, one line each. A change that fails several entries' guards is
    one line; the entries are named where the call missed more than one."""
    causes = recompile.get("causes") or []
    several = len({c.get("entry") for c in causes}) > 1
    by_text: dict[str, list[dict]] = {}
    for c in causes:
        by_text.setdefault(cause_text(c), []).append(c)
    lines = []
    for text, same in by_text.items():
        notes = []
        if several:
            ids = [c.get("entry", "?") for c in same]
            notes.append(f"entr{'y' if len(ids) == 1 else 'ies'} {', '.join(ids)}")
        read = (same[0].get("read_at") or "").split(": ", 1)[0]
        if read:
            notes.append(f"read at {read}")
        lines.append(text + (f"  ({'; '.join(notes)})" if notes else ""))
    return lines


def _reason(c: dict) -> str:
    """A cause in the words of Dynamo's own recompile reason for the guard: a value by its
    source as the guard reads it, locals bare (``G['n'] == 1``, ``n == 1``), so that a global
    is told from an argument."""
    name, field = c.get("input", "?"), c.get("field") or ""
    if c.get("check"):
        return c["check"]
    if c.get("guard") == "GLOBAL_STATE":
        return f"GLOBAL_STATE changed: {name}"
    if c.get("guard") in ("EQUALS_MATCH", "TRUE_MATCH", "FALSE_MATCH"):
        source = re.sub(r"\bL\['(\w+)'\]", r"\1", c.get("source") or name)
        return f"{source} == {c.get('before')}"
    if c.get("guard") != "TENSOR_MATCH":
        return cause_text(c)
    if "[" in field:
        what, dim = field.rstrip("]").split("[")
        return (
            f"tensor '{name}' {what} mismatch at index {dim}. "
            f"expected {c.get('before')}, actual {c.get('after')}"
        )
    return f"tensor '{name}' {field} mismatch. expected {c.get('before')}, actual {c.get('after')}"


def cause_reasons(causes: list[dict]) -> list[str]:
    """The causes that fail every cache entry the call tried, as Dynamo's reasons: what made
    the call compile again. A change only some entries reject (a shape an older entry was
    compiled for, where a newer one is dynamic) is no reason to compile; it stays listed."""
    entries = {c.get("entry") for c in causes}
    rejected: dict[tuple, set] = {}
    for c in causes:
        rejected.setdefault((c.get("input"), c.get("field")), set()).add(c.get("entry"))
    out = []
    for c in causes:
        text = _reason(c)
        if rejected[(c.get("input"), c.get("field"))] == entries and text not in out:
            out.append(text)
    return out
