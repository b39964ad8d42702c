"""Known causes of recompiles, graph breaks and cudagraph skips: what each means, what to do.

One table, :data:`CAUSES`. :func:`explain` finds the first cause whose pattern matches a
reason that Dynamo or Inductor gave, and returns the cause in words with the usual fix.
Unknown reasons come back as they are, with the general advice for their kind. Pure
functions of strings: no torch import (the dashboard and offline logs use them too).
"""

from __future__ import annotations

import re

from gt_core.observe.cause import Cause
from gt_core.observe.compile_causes import COMPILE_CAUSES
from gt_core.observe.hotpath_causes import HOTPATH_CAUSES
from gt_core.observe.jit_causes import JIT_CAUSES

__all__ = [
    "CAUSES",
    "Cause",
    "explain",
    "explain_change",
    "explain_id",
    "budget_message",
    "short_reason",
    "KINDS",
    "HOTPATH_KINDS",
]

# The kinds of diagnostics a reason can come from (the ``user.*`` event that carried it).
KINDS = ("recompile", "graph_break", "limit_hit", "cudagraph_skip", "failure", "budget", "routed")
# The kinds of gt's own reasons (its hot paths), as the dashboard's reasons table lists them.
HOTPATH_KINDS = (
    "signature_change",
    "revert",
    "compile_failed",
    "retired",
    "sync",
    "mismatch",
    "jit_refused",
    "jit_re-recording",
    "jit_frozen",
    "jit_would_save",
    "worker_error",
    "uploads",
    "fetches",
    "rows",
)


CAUSES: tuple[Cause, ...] = COMPILE_CAUSES + HOTPATH_CAUSES + JIT_CAUSES  # the one catalogue

# What to do when no known cause matched: the general advice for each kind.
_BY_ID = {c.id: c for c in CAUSES}
GENERAL_FIX = {
    "recompile": "find the value in the guard that changes between calls and keep it fixed, "
    "or pass it as a tensor",
    "graph_break": "move the line out of the compiled function, or rewrite it with torch ops",
    "limit_hit": _BY_ID["recompile_limit"].fix,
    "cudagraph_skip": "remove the reason named above from the compiled function",
    "failure": "read the message; the compiled function may run eagerly",
    "budget": _BY_ID["recompile_budget"].fix,
    "routed": _BY_ID["routed"].fix,
    "signature_change": "run %gt diff on the two signatures to see where they differ",
}


def short_reason(reason: str) -> str:
    """The part of a Dynamo reason worth a table cell: guard, or gb type and explanation.

    ``"0/3: G['c'].i[0] == 3   # if c.i[0] == 0:  # f.py:9 in step\\nUser stack..."`` →
    ``"G['c'].i[0] == 3"``.
    """
    text = reason.strip()
    text = re.sub(r"^\d+/\d+: ", "", text)
    first = text.split("\n", 1)[0]
    if "Graph Break Reason:" in text or "\n  Explanation:" in text:
        body = text.split("Graph Break Reason:", 1)[-1]
        lines = [ln.strip() for ln in body.split("\n") if ln.strip()]
        lines = [ln for ln in lines if not ln.startswith("Encountered graph break")]
        gb_type = lines[0] if lines else first
        expl = next(
            (ln[len("Explanation:") :].strip() for ln in lines if ln.startswith("Explanation:")), ""
        )
        return f"{gb_type}: {expl}" if expl else gb_type
    return re.sub(r"\s+#.*$", "", first).strip() or first


def explain(kind: str, reason: str, options: dict | None = None, **context) -> dict:
    """``{"id", "cause", "fix"}`` for a reason of ``kind`` (one of :data:`KINDS`).

    ``options``: what the hot path was compiled with (backend, mode, dynamic), so the fix
    never suggests what is already in use; None: unknown.
    ``context`` fills placeholders that come from the event rather than the text (``fn``).
    An unknown reason keeps its own text as the cause, with the general fix of its kind.
    """
    text = str(reason or "")
    guard = short_reason(text) if kind == "recompile" else text
    for c in CAUSES:
        groups = c.match(kind, guard)
        if groups is None and guard != text:
            groups = c.match(kind, text)
        if groups is not None:
            fill = {k: v for k, v in groups.items() if v}
            fill.update({k: str(v) for k, v in context.items() if v is not None})
            if c.tries:
                fill["tries"] = c.tries_for(options)
            return {"id": c.id, "cause": _format(c.cause, fill), "fix": _format(c.fix, fill)}
    return {"id": "unknown", "cause": short_reason(text) or kind, "fix": GENERAL_FIX.get(kind, "")}


def explain_change(change: dict | None, options: dict | None = None) -> dict:
    """``{"id", "cause", "fix"}`` for a recompile of gt's own hot path, from its typed change
    (``observe.graph.Change``'s data: its kind is the cause's id; nothing reads its words)."""
    kind = (change or {}).get("kind")
    if kind not in _BY_ID or "signature_change" not in _BY_ID[kind].kinds:
        return {"id": "unknown", "cause": "", "fix": GENERAL_FIX["signature_change"]}
    values = {k: change[k] for k in ("old", "new") if change.get(k) is not None}
    return explain_id(kind, options, **values)


def explain_id(cause_id: str, options: dict | None = None, **context) -> dict:
    """``{"id", "cause", "fix"}`` of the cause ``cause_id``, filled from ``context``: for
    reasons gt knows the kind of when it finds them (nothing reads their words)."""
    c = _BY_ID[cause_id]
    fill = {k: str(v) for k, v in context.items() if v is not None}
    if c.tries:
        fill["tries"] = c.tries_for(options)
    return {"id": c.id, "cause": _format(c.cause, fill), "fix": _format(c.fix, fill)}


def budget_message(function: str, used: int, limit: int, hit: bool = False) -> str:
    """``"kv_step: 6 of the 8 graphs `recompile_limit` allows compiled"`` and what happens at
    the limit (``hit``: it did). The limit counts a function's graphs (its cache entries),
    the first compile's included: 6 graphs are 5 recompiles."""
    allowed = f"{used} of the {limit} graphs `recompile_limit` allows compiled"
    if hit:
        return f"{function}: {allowed}, then the limit was hit: calls that need a new graph run eagerly"
    left = limit - used
    then = "the next recompile" if left <= 0 else f"{left} more and the next"
    return (
        f"{function}: {allowed} ({then} hits the limit: calls that need a new graph then run "
        "eagerly)"
    )


def _format(template: str, fill: dict) -> str:
    class _Keep(dict):
        def __missing__(self, key):  # a placeholder the pattern did not capture
            return "?"

    return template.format_map(_Keep(fill))
