"""A hot path's dependency graph, read from the canonical form its detection event carries.

The worker sends the canonical form's plain data (``canonical``) and one occurrence's value
metadata (``values``: name -> ``{"shape", "dtype"}``); the client builds the graph from
them: :func:`to_networkx` for analysis, :func:`graph_data` as the plain nodes and edges the
dashboard draws; :func:`diff` says in words where two signatures' plain data first differ.
No torch import; networkx is imported when a graph is built.
"""

from __future__ import annotations

from typing import NamedTuple

from gt_core.observe import events as ev

__all__ = [
    "consumed", "to_networkx", "graph_data", "graph_of", "change", "Change", "diff", "diff_text",
]  # fmt: skip


def _refs(x) -> list[str]:
    if isinstance(x, str) and x.startswith("%"):
        return [x[1:]]
    if isinstance(x, list):
        return [r for y in x for r in _refs(y)]
    if isinstance(x, dict):
        return [r for y in x.values() for r in _refs(y)]
    return []


def consumed(entry: dict) -> list[str]:
    """The value names an op entry of the plain canonical data reads, in argument order."""
    return _refs(entry["args"]) + _refs(entry["kwargs"])


def to_networkx(data: dict, values: dict | None = None):
    """A networkx DiGraph of a signature's plain data: inputs and ops as nodes, values as edges.

    ``values``: one run's value metadata (name -> ``{"shape", "dtype"}``); default the
    data's own ``values`` entry, if any.
    """
    import networkx as nx  # noqa: PLC0415 (only where a graph is built)

    g = nx.DiGraph(signature=data["signature"])
    producer: dict[str, str] = {}
    for inp in data["inputs"]:
        g.add_node(
            inp["name"],
            kind="input",
            label=inp["name"],
            op=None,
            shape=inp["shape"],
            dtype=inp["dtype"],
            freed=False,
        )
        producer[inp["name"]] = inp["name"]
    freed = {e["value"] for e in data["entries"] if e["kind"] == "free"}
    outputs = set(data["outputs"])
    values = data.get("values", {}) if values is None else values
    k = 0
    for e in data["entries"]:
        if e["kind"] != "op":
            continue
        node = f"op{k}"
        k += 1
        outs = e["outs"]
        # an in-place op names no new value: show the one it writes (its first argument)
        shown = values.get(outs[0] if outs else next(iter(consumed(e)), None), {})
        g.add_node(
            node,
            kind="op",
            label=e["op"].removeprefix("aten.").removesuffix(".default"),
            op=e["op"],
            shape=shown.get("shape"),
            dtype=shown.get("dtype"),
            outs=outs,
            output=any(o in outputs for o in outs),
            freed=bool(outs) and all(o in freed for o in outs),
        )
        for name in consumed(e):
            src = producer.get(name)
            if src is not None:
                g.add_edge(src, node, value=name)
        for o in outs:
            producer[o] = node
    for inp in data["inputs"]:
        if inp["name"] in freed:
            g.nodes[inp["name"]]["freed"] = True
    return g


def graph_data(canonical: dict, values: dict | None = None) -> dict:
    """The block's dependency graph as plain nodes and edges (what the dashboard draws)."""
    values = values or {}
    g = to_networkx(canonical, values)
    nodes = [
        {"id": n, **{k: v for k, v in a.items() if k != "outs"}} for n, a in g.nodes(data=True)
    ]
    outputs = set(canonical["outputs"])
    for name in canonical["outputs"]:
        nodes.append(
            {
                "id": f"out:{name}",
                "kind": "output",
                "label": name,
                "op": None,
                "shape": values.get(name, {}).get("shape"),
                "dtype": values.get(name, {}).get("dtype"),
                "freed": False,
            }
        )
    edges = [[u, v] for u, v in g.edges()]
    for n, a in g.nodes(data=True):
        for o in a.get("outs", ()) or ():
            if o in outputs:
                edges.append([n, f"out:{o}"])
    return {"nodes": nodes, "edges": edges}


def graph_of(events: list[dict], signature: str | None = None) -> dict | None:
    """The graph data of the latest ``hotpath.detected`` of ``signature`` (None: any)."""
    for e in reversed(events):
        if (
            e.get("type") in ev.FORMS
            and e.get("canonical")
            and signature in (None, e.get("signature"))
        ):
            return _graph_of_event(e)
    return None


# A detection's graph, built once: the dashboard redraws its graph only when it changes
# (a new object), and refreshes often. Keyed by the event object, held with it.
_BUILT: dict[int, tuple[dict, dict]] = {}
_KEEP = 64


def _graph_of_event(e: dict) -> dict:
    hit = _BUILT.get(id(e))
    if hit is not None and hit[0] is e:
        return hit[1]
    g = graph_data(e["canonical"], e.get("values"))
    if len(_BUILT) >= _KEEP:
        _BUILT.pop(next(iter(_BUILT)))
    _BUILT[id(e)] = (e, g)
    return g


# -- two signatures compared -----------------------------------------------------------
class Change(NamedTuple):
    """The first difference between two signatures: its ``kind`` (one of CHANGE_KINDS, the
    catalogue's cause of that id), the words, and the values before and after where there
    are (a batch size's)."""

    kind: str
    text: str
    old: object = None
    new: object = None

    def to_data(self) -> dict:
        return {"kind": self.kind, "old": self.old, "new": self.new}


CHANGE_KINDS = (
    "batch_size", "input_shape", "input_dtype", "input_stride", "input_device",
    "python_number", "kept_value", "different_work", "other",
)  # fmt: skip


def change(a: dict, b: dict) -> Change | None:
    """The first difference between two signatures' plain data (None if equal)."""
    if a["signature"] == b["signature"]:
        return None
    ea, eb = a["entries"], b["entries"]
    ins_a = {i["name"]: i for i in a["inputs"]}
    ins_b = {i["name"]: i for i in b["inputs"]}
    k = -1
    for pos, (x, y) in enumerate(zip(ea, eb, strict=False)):
        if x["kind"] == "op":
            k += 1
        if x["kind"] != y["kind"]:
            if "free" in (x["kind"], y["kind"]):
                fx = x if x["kind"] == "free" else y
                one, other = ("A", "B") if fx is x else ("B", "A")
                said = f"value {fx['value']} freed inside the block in {one}, not in {other}"
                return Change("kept_value", f"{said} (instruction {pos})")
            return Change("different_work", f"instruction {pos}: {x['kind']} → {y['kind']}")
        if x["kind"] == "free":
            if x["value"] != y["value"]:
                said = f"instruction {pos}: frees {x['value']} in A, {y['value']} in B"
                return Change("other", said)
            continue
        if x["op"] != y["op"]:
            return Change("different_work", f"op {k}: {_short(x['op'])} → {_short(y['op'])}")
        for j, (ra, rb) in enumerate(zip(consumed(x), consumed(y), strict=False)):
            if ra != rb:
                said = f"input {j} is {ra} in A, {rb} in B (a different dependency)"
                return Change("other", f"op {k} ({_short(x['op'])}): {said}")
            if ra in ins_a and rb in ins_b:
                c = _input_change(ins_a[ra], ins_b[rb], f"op {k} ({_short(x['op'])}): input {j}")
                if c is not None:
                    return c
        if x["args"] != y["args"] or x["kwargs"] != y["kwargs"]:
            said = f"op {k} ({_short(x['op'])}): arguments {_args(x)} → {_args(y)}"
            return Change("python_number", said)
    if len(ea) != len(eb):
        longer, one, other = (ea, "A", "B") if len(ea) > len(eb) else (eb, "B", "A")
        extra = longer[min(len(ea), len(eb))]
        if extra["kind"] == "free":
            said = f"value {extra['value']} freed inside the block in {one}, not in {other}"
            return Change("kept_value", said)
        return Change("different_work", f"block A has {len(ea)} instructions, block B {len(eb)}")
    for ia, ib in zip(a["inputs"], b["inputs"], strict=False):
        c = _input_change(ia, ib, f"input {ia['name']}")
        if c is not None:
            return c
    return Change("other", "the blocks differ in their outputs")


def _input_change(ia: dict, ib: dict, where: str) -> Change | None:
    for field in ("shape", "dtype", "device", "stride"):
        old, new = ia[field], ib[field]
        if old != new:
            text = f"{where} {field} {old} → {new}"
            if field != "shape":
                return Change(f"input_{field}", text)
            if len(old) == len(new) and old and old[0] != new[0] and old[1:] == new[1:]:
                return Change("batch_size", text, old[0], new[0])
            return Change("input_shape", text)
    return None


def diff(a: dict, b: dict) -> str | None:
    """The first difference between two signatures' plain data, in words (None if equal)."""
    c = change(a, b)
    return None if c is None else c.text


def diff_text(a: dict, b: dict) -> str:
    """``diff`` as one line for people: 'same signature' when equal."""
    d = diff(a, b)
    return f"{a['signature']} → {b['signature']}: {d}" if d else f"{a['signature']}: same signature"


def _short(op: str) -> str:
    return op.removesuffix(".default")


def _args(e: dict) -> str:
    parts = [str(x) for x in e["args"]] + [f"{k}={v}" for k, v in e["kwargs"].items()]
    return "(" + ", ".join(parts) + ")"
