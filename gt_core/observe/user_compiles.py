"""The user's own torch.compile calls, folded per function from ``user.*`` events.

``summarize_user_compiles(events)`` is pure (no torch), like ``report.summarize`` that
calls it: a live session, a saved log and the dashboard read the same data.
"""

from __future__ import annotations

import re

from gt_core.observe import events as ev
from gt_core.observe.causes import budget_message, explain, explain_id, short_reason
from gt_core.observe.guard_causes import cause_reasons

__all__ = ["summarize_user_compiles"]

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
        _checked(u)
        for x in u["explanations"]:
            for k in _PRIVATE:
                del x[k]
        u["compile_seconds"] = round(u["compile_seconds"], 6)
        u["time_split"] = {k: round(v, 6) for k, v in u["time_split"].items()}
    return list(fns.values())


def _compiled(u: dict, e: dict) -> None:
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
}


def _explained(u: dict, e: dict, seen: set) -> None:
    """The event's causes and fixes: its reason's, and a recompile's every other cause (each
    failing guard that every entry it tried rejects); one line per cause, counted once per
    event."""
    kind, text = _explain_event(e)
    texts = [text, *cause_reasons(e.get("causes") or [])] if kind == "recompile" else [text]
    keys: set = set()
    for t in texts:
        x = explain(kind, t, fn=u["function"], limit=e.get("limit"))
        key = (kind, x["id"] if x["id"] != "unknown" else x["cause"])
        if key not in keys:
            keys.add(key)
            _explanation(u, e, seen, kind, t, x, key)


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
# A recompile's guard on a Python number's value, and the causes that explain one.
_VALUE = re.compile(r"^(?P<expr>.+?)\s*==\s*(?P<value>-?\d+(?P<float>\.\d*(?:e-?\d+)?)?)$")
_VALUE_CAUSES = ("int_argument", "int_from_mutable_state", "float_constant")
# A recompile's guard on a tensor's size, and a tensor guard's sizes in a cache entry.
_SIZE = re.compile(
    r"^tensor '(?P<name>[^']+)' size mismatch at index (?P<dim>\d+)\. expected (?P<old>\d+), actual (?P<new>\d+)"
)
_TENSOR = re.compile(r"check_tensor\((?P<src>[^,]+),.*?size=\[(?P<size>[^\]]*)\]")


def _line(e: dict) -> str:
    """The user's source line an event happened at (a break's innermost frame)."""
    stack = e.get("stack") or []
    return (stack[-1].get("text") if stack else e.get("source")) or ""


_STEERS = re.compile(r"^(?:if|elif|while)\b|\bif\b.+\belse\b")


def _plain(guard: str) -> str:
    """A guard as Dynamo's recompile reason writes it: locals bare (``L['n']`` -> ``n``)."""
    return re.sub(r"\bL\['(\w+)'\]", r"\1", guard)


def _checked(u: dict) -> None:
    """Words that are true for the torch that ran, read from the cache entries as the block
    ended (``user.entries``); without them (a live view before the block ends) the
    catalogue's words stand, which claim neither.

    - a value's recompiles: the entry a recompile on the value made no longer guards its
      number: torch made it dynamic; one that does: it stayed specialized, and every entry
      that guards it is a graph of its own;
    - a shape's recompiles under automatic dynamic shapes: the entry made keeps the size
      static (the code needs it as an int): each size is a graph of its own, whatever
      ``dynamic`` says;
    - an ``.item()`` break on a line that branches on it: the break stays whatever
      ``capture_scalar_outputs`` says;
    - a ``print`` of a value other than a tensor or a constant: Dynamo cannot reorder it,
      whatever ``reorderable_logging_functions`` holds;
    - a break that raised (``fullgraph=True``) split no graph."""
    made = {en["compile_id"]: en for en in u["entries"]}
    for x in u["explanations"]:
        if x["id"] == "item" and _STEERS.search(x["line"]):
            x.update(explain_id("item_steers_python", line=x["line"]))
        if x["id"] == "print":
            _print_checked(x)
        if x["kind"] == "graph_break" and x["raised"]:
            x["cause"] = x["cause"].replace(
                "splits the graph", "breaks the graph, an error under fullgraph=True"
            )
        entries = [made[c] for c in x["compile_ids"] if c in made]
        if not entries:
            continue
        if x["id"] in _VALUE_CAUSES and _VALUE.match(x["guard"]):
            _value_checked(u, x, entries)
        elif x["id"] == "shape_change" and x["automatic_dynamic"] and _SIZE.match(x["guard"]):
            _shape_checked(u, x, entries)


# What Dynamo can reorder out of a graph (reorderable_logging_functions): calls whose
# arguments are tensors, constants or string formats; a break names the arguments' types.
_PRINT_TYPES = re.compile(r"`print` with argument types \[(?P<types>[^\]]*)\]")
_REORDERABLE = {"Tensor", "str", "int", "float", "bool", "NoneType"}


def _print_checked(x: dict) -> None:
    m = _PRINT_TYPES.search(x["text"])
    if m is None:
        return
    others = [t.strip(" '\"") for t in m["types"].split(",")]
    others = [t for t in others if t and t not in _REORDERABLE]
    if others:
        named = ", ".join(f"`{t}`" for t in dict.fromkeys(others))
        x["fix"] = (
            "move the print out of the compiled function (print its results after the call); "
            "`torch._dynamo.config.reorderable_logging_functions` cannot take it: it prints a "
            f"{named}, and only calls on tensors and constants can be reordered"
        )


def _value_checked(u: dict, x: dict, entries: list[dict]) -> None:
    m = _VALUE.match(x["guard"])
    expr, value, is_float = m["expr"], m["value"], bool(m["float"])
    # (Dynamo's reason names a local bare, ``n == 1``; entries guard ``L['n'] == 1``)
    held = re.compile(r"(?<![\w.\]'])" + re.escape(_plain(expr)) + r"\s*==\s*-?\d")
    holds = [any(held.search(_plain(g)) for g in en["guards"]) for en in entries]
    if not holds[-1]:
        avoid = (
            " (to avoid it, pass it as a 0-d tensor)"
            if is_float
            else " (to avoid it, compile with `dynamic=True`)"
        )
        x.update(explain_id("value_made_dynamic", expr=expr, value=value, avoid=avoid))
        return
    graphs = sum(any(held.search(_plain(g)) for g in en["guards"]) for en in u["entries"])
    x.update(_specialized(x, expr, value, is_float, graphs))


def _static_size(entry: dict, name: str, dim: int) -> int | None:
    """The size an entry's tensor guard on ``name`` fixes at ``dim`` (None: dynamic)."""
    for g in entry["guards"]:
        t = _TENSOR.search(g)
        if t and re.sub(r"\b[LG]\['(\w+)'\]", r"\1", t["src"]) == name:
            sizes = [s.strip() for s in t["size"].split(",")]
            return int(sizes[dim]) if dim < len(sizes) and sizes[dim].isdigit() else None
    return None


def _shape_checked(u: dict, x: dict, entries: list[dict]) -> None:
    m = _SIZE.match(x["guard"])
    name, dim = m["name"], int(m["dim"])
    if _static_size(entries[-1], name, dim) is None:
        return  # made dynamic (automatic dynamic shapes): the catalogue's words are true
    graphs = sum(_static_size(en, name, dim) is not None for en in u["entries"])
    x.update(
        explain_id(
            "shape_kept_static",
            name=name,
            dim=dim,
            old=m["old"],
            new=m["new"],
            graphs=f"{graphs} graph{'s' if graphs != 1 else ''}",
        )
    )


# The fix of an int read from state where no Python branch reads it (``x * cfg.n``).
_STATE_TENSOR = (
    "keep it in a 0-d tensor updated in place (`{name} = torch.tensor({value})`, then "
    "`{name}.fill_(v)` or `{name}.add_(1)`): a tensor's value is an input of the graph, so a "
    "new value compiles nothing"
)


def _specialized(x: dict, expr: str, value: str, is_float: bool, n: int) -> dict:
    """The words of ``x`` (a value's recompiles on ``expr``, first ``value``) where torch kept
    the value specialized: ``n`` graphs guard it, one per value."""
    if is_float:
        why = " (`specialize_float` was on)" if x["specialize_float"] else ""
        fix = "pass it as a 0-d tensor instead of a Python float"
        if x["specialize_float"]:
            fix += " (or set `torch._dynamo.config.specialize_float = False`)"
    elif x["id"] == "int_from_mutable_state":
        why = (
            "; torch reads an int of an object or a global as a constant, so `dynamic=True` "
            "would not help"
        )
        name = re.sub(r"\b[LG]\['(\w+)'\]", r"\1", expr)
        fix = (
            x["fix"] if _STEERS.search(x["line"]) else _STATE_TENSOR.format(name=name, value=value)
        )
    else:
        why = (
            "; it steers Python control flow or a size torch must know (a loop count, "
            "`range`, a shape), so `dynamic=True` would not help"
        )
        fix = (
            "expected if it takes a few values (each compiles once); with many, call it with a "
            "few fixed values (buckets), or keep the loop or branch on it outside the compiled "
            "function"
        )
    graphs = f"{n} graph{'s' if n != 1 else ''}"
    cause = f"{x['cause']}; torch kept it specialized ({graphs} so far): each new value "
    return {"cause": cause + f"needs a graph of its own{why}", "fix": fix}
