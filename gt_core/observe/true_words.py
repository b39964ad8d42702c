"""The words of a user's compile explanations held to what torch did: each explanation's
cause and fix re-worded where the cache entries as a block ended (``user.entries``) or the
event's own text tell what the catalogue's words cannot (was a value made dynamic? does the
code need a size as an int? can Dynamo reorder this print?).

Pure (no torch), like :mod:`.user_compiles` that calls :func:`checked` on each function.
"""

from __future__ import annotations

import re

from gt_core.observe.causes import explain_id

__all__ = ["checked"]

# A recompile's guard on a Python number's value, and the causes that explain one.
_VALUE = re.compile(r"^(?P<expr>.+?)\s*==\s*(?P<value>-?\d+(?P<float>\.\d*(?:e-?\d+)?)?)$")
_VALUE_CAUSES = ("int_argument", "int_from_mutable_state", "float_constant")
# A recompile's guard on a tensor's size, and a tensor guard's sizes in a cache entry.
_SIZE = re.compile(
    r"^tensor '(?P<name>[^']+)' size mismatch at index (?P<dim>\d+)\. expected (?P<old>\d+), actual (?P<new>\d+)"
)
_TENSOR = re.compile(r"check_tensor\((?P<src>[^,]+),.*?size=\[(?P<size>[^\]]*)\]")
# A source line that branches on a value (an ``.item()``'s, an int's).
_STEERS = re.compile(r"^(?:if|elif|while)\b|\bif\b.+\belse\b")


def _plain(guard: str) -> str:
    """A guard as Dynamo's recompile reason writes it: locals bare (``L['n']`` -> ``n``)."""
    return re.sub(r"\bL\['(\w+)'\]", r"\1", guard)


def checked(u: dict) -> None:
    """Words that are true for the torch that ran, read from the cache entries as the block
    ended (``user.entries``); without them (a live view before the block ends) the
    catalogue's words stand, which claim neither.

    - a value's recompiles: the entry a recompile on the value made no longer guards its
      number: torch made it dynamic; one that does: it stayed specialized, and every entry
      that guards it is a graph of its own (an int read from state where no Python branch
      reads it is not told to replace "the branch on it");
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
    if _static_size(entries[0], name, dim) is None:  # (the recompile the words describe)
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
