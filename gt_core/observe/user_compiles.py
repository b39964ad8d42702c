"""The user's own torch.compile calls, folded per function from ``user.*`` events.

``summarize_user_compiles(events)`` is pure (no torch), like ``report.summarize`` that
calls it: a live session, a saved log and the dashboard read the same data.
"""

from __future__ import annotations

import re

from gt_core.observe import events as ev
from gt_core.observe.causes import budget_message, explain, explain_id, short_reason
from gt_core.observe.guard_causes import cause_reasons
from gt_core.observe.true_words import checked

__all__ = ["breaks_text", "calls_text", "compiling_text", "summarize_user_compiles"]

_KIND = {
    ev.USER_RECOMPILE: "recompile",
    ev.USER_GRAPH_BREAK: "graph_break",
    ev.USER_LIMIT_HIT: "limit_hit",
    ev.USER_CUDAGRAPH_SKIP: "cudagraph_skip",
    ev.USER_FAILURE: "failure",
    ev.USER_BUDGET: "budget",
    ev.USER_ROUTED: "routed",
}


def _new(function: str) -> dict:
    return {
        "function": function,
        "compiles": 0,  # compiles of the function itself (its first compile and recompiles)
        "graphs": 0,  # graphs made, graph-break resumes included
        "ops": 0,
        "compile_seconds": 0.0,
        "time_split": {"dynamo_s": 0.0, "aot_s": 0.0, "inductor_s": 0.0},
        "compile_ids": [],
        "timeline": [],  # each compile: when it ended (t), seconds, id; for the dashboard
        "recompile_reasons": [],
        "recompiles": [],
        "graph_breaks": [],
        "limit_hit": False,
        "limit": None,
        "cudagraph_skips": [],
        "failures": [],
        "budget": None,
        "routed": False,
        "explanations": [],
        "entries": [],  # its cache entries as the block ended: {compile_id, code, guards}
        "calls": None,  # its calls' outcomes and times, the latest user.calls snapshot
        "compiling": None,  # a compile under way: {phase, seconds, cache, backward, t}
        "backward_compiles": 0,  # AOT autograd's compiles of its backward (at a first backward)
        "backward_seconds": 0.0,
    }


def _recompile_text(e: dict) -> str:
    reason = e.get("reason", "")
    where = e.get("where")
    if where and e.get("source"):
        return f"{reason}  ({where}: {e['source']})"
    return f"{reason}  ({where})" if where else reason


def _explain_event(e: dict) -> tuple[str, str]:
    """(kind, the text a cause is matched against) of one diagnostics event."""
    kind = _KIND[e["type"]]
    if kind == "graph_break":
        return kind, e.get("detail") or e.get("reason", "")
    if kind == "budget":
        return kind, e.get("message", "")
    if kind == "limit_hit":
        return kind, f"hit config.{e.get('limit_type', 'recompile_limit')} ({e.get('limit')})"
    if kind == "failure":
        return kind, e.get("reason", "")
    return kind, e.get("reason", "")


def _budget_spent(u: dict) -> None:
    """After a limit hit the budget is history: "the next recompile makes it run eagerly" has
    happened. The limit-hit explanation says so; the budget's own row would contradict it."""
    u["explanations"] = [x for x in u["explanations"] if x["kind"] != "budget"]
    b = u["budget"]
    if b is not None:
        b["message"] = budget_message(u["function"], b["used"], b["limit"], hit=True)


def summarize_user_compiles(events: list[dict]) -> list[dict]:
    """One entry per compiled function, in order of first appearance (their fields: see the README)."""
    fns: dict[str, dict] = {}
    seen: dict[str, set] = {}  # per function, the causes already explained
    for e in events:
        t = e.get("type")
        if t not in _FOLD:
            continue
        name = e.get("function") or "?"
        if name not in fns:
            fns[name], seen[name] = _new(name), set()
        u = fns[name]
        _FOLD[t](u, e)
        if t in _KIND:
            _explained(u, e, seen[name])
    for u in fns.values():
        if u["limit_hit"]:
            _budget_spent(u)
        checked(u)
        _ranked(u)
        for x in u["explanations"]:
            for k in _PRIVATE:
                del x[k]
        u["compile_seconds"] = round(u["compile_seconds"], 6)
        u["time_split"] = {k: round(v, 6) for k, v in u["time_split"].items()}
    return list(fns.values())


def _compiled(u: dict, e: dict) -> None:
    if e.get("backward"):  # (a compile of its own, not a recompile of the function)
        u["backward_compiles"] += 1
        u["backward_seconds"] = round(u["backward_seconds"] + (e.get("seconds") or 0.0), 6)
        return
    if not e.get("resume"):
        u["compiles"] += 1
    u["graphs"] += e.get("graphs", 0) or 0
    u["ops"] += e.get("ops", 0) or 0
    u["compile_seconds"] += e.get("seconds") or 0.0
    for k in u["time_split"]:
        u["time_split"][k] += e.get(k) or 0.0
    u["compile_ids"].append(e.get("compile_id"))
    u["timeline"].append(
        {k: e.get(k) for k in ("t", "seconds", "compile_id", "recompile", "resume")}
    )


def _recompiled(u: dict, e: dict) -> None:
    u["recompile_reasons"].append(_recompile_text(e))
    r = {k: e.get(k, "") for k in ("compile_id", "reason", "where", "source")}
    r["causes"] = list(e.get("causes") or [])  # every failing guard of the entries it missed
    u["recompiles"].append(r)


def _graph_break(u: dict, e: dict) -> None:
    key = (e.get("reason"), e.get("where"))
    same = next((b for b in u["graph_breaks"] if (b["reason"], b["where"]) == key), None)
    if same is not None:
        same["count"] += 1
    else:
        u["graph_breaks"].append(
            {
                "reason": e.get("reason", ""),
                "where": e.get("where", ""),
                "count": 1,
                "stack": e.get("stack") or [],  # the user's frames, outermost first
            }
        )


def _limit_hit(u: dict, e: dict) -> None:
    u["limit_hit"], u["limit"] = True, e.get("limit")


def _budget(u: dict, e: dict) -> None:
    u["budget"] = {k: e.get(k) for k in ("used", "limit", "message")}


def _routed(u: dict, e: dict) -> None:
    u["routed"] = True


_FOLD = {  # one handler per event type: what it adds to its function's entry
    ev.USER_RECOMPILE: _recompiled,
    ev.USER_GRAPH_BREAK: _graph_break,
    ev.USER_LIMIT_HIT: _limit_hit,
    ev.USER_CUDAGRAPH_SKIP: lambda u, e: u["cudagraph_skips"].append(e.get("reason", "")),
    ev.USER_FAILURE: lambda u, e: u["failures"].append(
        f"{e.get('kind', 'failure')}: {e.get('reason', '')}"
    ),
    ev.USER_BUDGET: _budget,
    ev.USER_ROUTED: _routed,
    ev.USER_COMPILE: _compiled,
    ev.USER_ENTRIES: lambda u, e: u["entries"].extend(e.get("entries") or []),
    ev.USER_COMPILING: lambda u, e: _compiling(u, e),
    ev.USER_CALLS: lambda u, e: u.update(
        calls={k: e.get(k) for k in _CALL_FIELDS if k in e} | {"t": e.get("t")}
    ),
}
_CALL_FIELDS = (
    "calls",
    "outcomes",
    "median_ms",
    "samples",
    "speedup",
    "compared",
    "eager_every",
    "graph_ms",
    "breaks",
)
_OUTCOME_WORDS = {
    "compiled": "compiled",
    "compiling": "compiling",
    "eager": "eagerly (no cached graph fitted, none compiled)",
    "partly_eager": "partly eagerly",
    "eager_sample": "eagerly as samples",
    "raised": "raised an error",
}


def _compiling(u: dict, e: dict) -> None:
    """A compile under way (the latest word on it), or its end."""
    done = e.get("done")
    u["compiling"] = (
        None if done else {k: e.get(k) for k in ("phase", "seconds", "cache", "backward", "t")}
    )


def compiling_text(u: dict) -> str:
    """A compile under way in words ('' if none): which function, which phase, how long."""
    c = u.get("compiling")
    if not c:
        return ""
    what = f"{u['function']}'s backward" if c.get("backward") else u["function"]
    cache = ", inductor's cache missed" if c.get("cache") == "miss" else ""
    return f"compiling {what}: {c.get('phase')} · {c.get('seconds') or 0:.0f} s so far{cache}"


def _ranked(u: dict) -> None:
    """Each graph break with what it cost at run time (its site's calls and the time outside
    the graphs there, from ``user.calls``), the costliest first."""
    cost = {b["where"]: b for b in (u.get("calls") or {}).get("breaks") or ()}
    for b in u["graph_breaks"]:
        seen = cost.get(b["where"])
        b["calls"] = seen["calls"] if seen else None
        b["outside_ms"] = seen["ms"] if seen else None
    u["graph_breaks"].sort(key=lambda b: -(b["outside_ms"] or 0.0))


def breaks_text(u: dict) -> list[str]:
    """Each graph break that ran in a compiled call: where, in how many calls, and the time
    outside the graphs there, the costliest first."""
    return [
        f"graph break at {b['where']}: in {b['calls']} compiled call(s), "
        f"{_ms(b['outside_ms'])} outside the graphs ({_ms(b['outside_ms'] / b['calls'])} a call)"
        for b in u.get("graph_breaks", ())  # (a log written before breaks were costed)
        if b.get("calls")
    ]


def _ms(ms: float) -> str:
    return f"{ms / 1e3:.3g} s" if ms >= 1e3 else f"{ms:.3g} ms"


def calls_text(u: dict) -> str:
    """A function's calls in words: how many ran which way, their median times, and the
    compiled calls against eager on the same inputs (or why that is not measured)."""
    c = u.get("calls")
    if not c or not c.get("calls"):
        return ""
    outcomes, ms = c.get("outcomes") or {}, c.get("median_ms") or {}
    words = []
    for o, n in outcomes.items():
        how = _OUTCOME_WORDS.get(o, o)
        if o == "eager" and u.get("limit_hit"):
            how = "eagerly (past the recompile limit, no cached graph fitted)"
        at = f", median {_ms(ms[o])}" if o in ms else ""
        words.append(f"{n} {how}{at}")
    text = f"{c['calls']} call(s): " + "; ".join(words)
    if c.get("speedup"):
        n = c.get("compared", 0)
        text += (
            f". Compiled {c['speedup']:.3g}x eager on the same inputs "
            f"({n} eager sample(s) against the compiled calls' median)"
        )
    elif not c.get("eager_every"):
        text += ". Compiled vs eager: not measured (eager samples off: GT_USER_EAGER_EVERY=0)"
    elif outcomes.get("compiled"):
        every, n, needed = c["eager_every"], c.get("compared", 0), c.get("compared_needed", 3)
        text += (
            f". Compiled vs eager: not measured yet ({n} eager sample(s) of the {needed} it takes; "
            f"every {every}th call runs eagerly as a sample where its inputs equal the last "
            "compiled call's)"
        )
    return text


def _explained(u: dict, e: dict, seen: set) -> None:
    """The event's causes and fixes: its reason's, and a recompile's every other cause (each
    failing guard that every entry it tried rejects); one line per cause, counted once per
    event."""
    kind, text = _explain_event(e)
    texts = [text, *cause_reasons(e.get("causes") or [])] if kind == "recompile" else [text]
    keys: set = set()
    for t in texts:
        x = _size_one(t) if kind == "recompile" else None
        x = x or explain(kind, t, fn=u["function"], limit=e.get("limit"))
        key = (kind, x["id"] if x["id"] != "unknown" else x["cause"])
        if key not in keys:
            keys.add(key)
            _explanation(u, e, seen, kind, t, x, key)


_TO_SIZE_ONE = re.compile(
    r"^tensor '(?P<name>[^']+)' size mismatch at index (?P<dim>\d+)\. expected \d+, actual [01]$"
)


def _size_one(text: str) -> dict | None:
    """A size changed to 0 or 1: torch specializes those sizes whatever ``dynamic`` says, so
    the words are those of the size, not of a shape change (which ``dynamic=True`` fixes)."""
    m = _TO_SIZE_ONE.match(short_reason(text))
    return explain_id("size_one", name=m["name"], dim=m["dim"]) if m else None


def _explanation(u: dict, e: dict, seen: set, kind: str, text: str, x: dict, key) -> None:
    """One cause of an event: the first occurrence words it, later ones count (a budget's
    latest words stand)."""
    if key in seen:
        old = next(y for y in u["explanations"] if (y["kind"], y["key"]) == key)
        if kind == "budget":  # the latest budget is the one that matters
            old["cause"] = x["cause"]
        else:
            old["count"] += 1
            old["compile_ids"].append(e.get("compile_id"))
        return
    seen.add(key)
    u["explanations"].append(
        {
            "cause": x["cause"],
            "fix": x["fix"],
            "kind": kind,
            "id": x["id"],
            "where": e.get("where", ""),  # file:line of the first occurrence, when known
            "count": 1,
            "key": key[1],
            "guard": short_reason(text) if kind == "recompile" else "",
            "line": _line(e),
            "compile_ids": [e.get("compile_id")],
            "specialize_float": e.get("specialize_float"),
            "automatic_dynamic": e.get("automatic_dynamic"),
            "raised": bool(e.get("raised")),  # a graph break that raised (fullgraph=True)
            "text": text,
        }
    )


# What an explanation keeps while the summary is made, dropped from what it returns.
_PRIVATE = (
    "key",
    "guard",
    "line",
    "compile_ids",
    "specialize_float",
    "automatic_dynamic",
    "raised",
    "text",
)


def _line(e: dict) -> str:
    """The user's source line an event happened at (a break's innermost frame)."""
    stack = e.get("stack") or []
    return (stack[-1].get("text") if stack else e.get("source")) or ""
