"""What the explorer shows, as plain data: choices, the grouped graph, a node's details,
the annotated lines, the compile's rows and a diff. No widgets, no torch: the widget only
draws these, and tests read them.
"""

from __future__ import annotations

import difflib

from gt_core.observe.graph import consumed, diff_text, graph_data
from gt_core.observe.guard_causes import cause_lines
from gt_core.observe.user_compiles import calls_text

from ._groups import auto_open, chain, groups, ops_of, shown_as

__all__ = [
    "choices",
    "groups",
    "auto_open",
    "grouped_graph",
    "node_detail",
    "source_rows",
    "compile_rows",
    "user_rows",
    "differing",
]


def choices(data: dict) -> list[tuple[str, str]]:
    """(label, key) of each hot path ("sig") and user torch.compile ("user:function")."""
    out = [
        (f"hot path {p['signature']} [{p['status']}] {p['n_ops']} ops", p["signature"])
        for p in data["hot_paths"]
        if p.get("canonical")
    ]
    out += [
        (f"torch.compile {u['function']}", "user:" + u["function"]) for u in data["user_compiles"]
    ]
    return out


def first_shown(data: dict, keys: list[str], default: str | None) -> str | None:
    """The hot path to open on: ``default`` where its ops carry their lines, else the last
    listed one whose ops do (a block whose lines were not taken yet draws no module groups:
    see gt_core.client.plans.sites), else ``default``."""

    def sited(key: str | None) -> bool:
        p = path_of(data, key or "")
        entries = (p or {}).get("canonical", {}).get("entries", [])
        return any(e.get("source") for e in entries)

    if sited(default):
        return default
    return next((k for k in reversed(keys) if sited(k)), default)


def path_of(data: dict, sig: str) -> dict | None:
    return next((p for p in data["hot_paths"] if p["signature"] == sig), None)


def _ops(canonical: dict) -> list[dict]:
    return ops_of(canonical)


def grouped_graph(canonical: dict, values: dict | None, opened=()) -> dict:
    """The block's graph data with each group not in ``opened`` collapsed to one node."""
    full = graph_data(canonical, values)
    ops = _ops(canonical)
    sizes = dict(groups(canonical))
    into: dict[str, str] = {}
    for k, e in enumerate(ops):
        g = shown_as(e, opened, sizes)
        if g is not None:
            into[f"op{k}"] = "group:" + g
    nodes, seen = [], set()
    for n in full["nodes"]:
        gid = into.get(n["id"])
        if gid is None:
            k = n["id"][2:] if n["id"].startswith("op") else None
            nodes.append({**n, "group": chain(ops[int(k)])[-1] if k is not None else None})
        elif gid not in seen:
            seen.add(gid)
            g = gid[6:]
            nodes.append({"id": gid, "kind": "op", "label": f"{g} ({sizes[g]} ops)", "op": None,
                          "shape": None, "dtype": None, "freed": False, "group": g})  # fmt: skip
    # A collapsed group may both feed and read another one: only edges that go forward in
    # the block's order (a group at its first op) are kept, so the graph stays acyclic.
    order = {n["id"]: _rank(n["id"], len(ops)) for n in full["nodes"]}
    for n_id, gid in into.items():
        order[gid] = min(order.get(gid, order[n_id]), order[n_id])
    edges, seen_edges = [], set()
    for u, v in full["edges"]:
        u, v = into.get(u, u), into.get(v, v)
        if u != v and (u, v) not in seen_edges and order[u] < order[v]:
            seen_edges.add((u, v))
            edges.append([u, v])
    return {"nodes": nodes, "edges": edges}


def _rank(node: str, n_ops: int) -> int:
    """A node's place in the block: inputs first, ops in order, outputs last."""
    if node.startswith("op"):
        return int(node[2:])
    return n_ops if node.startswith("out:") else -1


def node_detail(canonical: dict, values: dict | None, node: str) -> dict:
    """A graph node's op, arguments, shapes and dtypes, and the line that recorded it."""
    values = values or canonical.get("values") or {}
    inputs = {i["name"]: i for i in canonical["inputs"]}
    if node.startswith("group:"):
        g = node[6:]
        members = [e["op"] for e in _ops(canonical) if g in chain(e)]
        return {"node": node, "group": g, "ops": members}
    if not node.startswith("op"):
        meta = inputs.get(node) or values.get(node.removeprefix("out:"), {})
        return {"node": node, "shape": meta.get("shape"), "dtype": meta.get("dtype")}
    e = _ops(canonical)[int(node[2:])]

    def meta(name):
        m = inputs.get(name) or values.get(name) or {}
        return {"value": name, "shape": m.get("shape"), "dtype": m.get("dtype")}

    return {
        "node": node,
        "op": e["op"],
        "args": e["args"],
        "kwargs": e["kwargs"],
        "inputs": [meta(n) for n in consumed(e)],
        "outputs": [meta(n) for n in e["outs"]],
        **{k: e.get(k) for k in ("source", "text", "module", "phase")},
        **({"optimizer": e["optimizer"]} if e.get("optimizer") else {}),
    }


def source_rows(data: dict, sig: str | None) -> list[dict]:
    """The user's lines gt saw: each with the hot paths whose ops it recorded, the ops and
    time share in hot path ``sig``, its syncs, uploads, frozen numbers and compile events;
    in file and line order."""
    rows: dict[str, dict] = {}

    def row(src: str, text: str = "") -> dict:
        if src not in rows:
            rows[src] = dict.fromkeys(_COLUMNS, "")
            rows[src].update(line=src, source=text or _text(src), **{"hot paths": []})
        return rows[src]

    for p in data["hot_paths"]:
        for line in p.get("lines", []):
            r = row(line["source"], line["text"])
            r["hot paths"].append(p["signature"])
            if p["signature"] == sig:
                share = "-" if line["share"] is None else f"{100 * line['share']:.1f}%"
                r.update(ops=line["ops"], which=_kinds(p, line["source"]), share=share)
                r["also"] = _frozen(p, line["source"])
    for kind in ("syncs", "uploads"):
        for src, n in data.get("lines", {}).get(kind, {}).items():
            row(src)[kind] = n
    for src, said in _user_lines(data).items():
        r = row(src)
        r["also"] = "; ".join(filter(None, [r["also"], *said]))
    for r in rows.values():
        r["hot paths"] = ", ".join(r["hot paths"])
    return sorted(rows.values(), key=lambda r: _order(r["line"]))


_COLUMNS = ("line", "source", "hot paths", "ops", "which", "share", "syncs", "uploads", "also")


def _order(src: str) -> tuple:
    file, _, n = src.rpartition(":")
    return (file, int(n) if n.isdigit() else 0)


def _text(src: str) -> str:
    import linecache  # noqa: PLC0415

    file, _, n = src.rpartition(":")
    return linecache.getline(file, int(n)).strip() if n.isdigit() else ""


def _kinds(p: dict, src: str) -> str:
    ops = [e for e in _ops(p["canonical"]) if e.get("source") == src]
    kinds = sorted({e["op"].removeprefix("aten.").removesuffix(".default") for e in ops})
    return ", ".join(kinds[:8]) + (" …" if len(kinds) > 8 else "")


def _frozen(p: dict, src: str) -> str:
    """The numbers a jit replay freezes in the ops of this line."""
    ops = {e["op"] for e in _ops(p["canonical"]) if e.get("source") == src}
    said = [
        f"frozen {f['op']} {f['arg']} = {f['value']}"
        for f in p.get("frozen_scalars", [])
        if f.get("op") in ops
    ]
    return "; ".join(said)


def _user_lines(data: dict) -> dict[str, list[str]]:
    """file:line -> what the user's own compiles say of it (graph breaks, recompiles)."""
    out: dict[str, list[str]] = {}
    for u in data["user_compiles"]:
        for b in u["graph_breaks"]:
            if b["where"]:
                out.setdefault(b["where"], []).append(
                    f"graph break ({u['function']}): {b['reason']}"
                )
        for r in u["recompiles"]:
            if r["where"]:
                out.setdefault(r["where"], []).append(f"recompile ({u['function']}): {r['reason']}")
    return out


def compile_rows(p: dict) -> list[dict]:
    """A hot path's compile: seconds per phase, then the total and the cache."""
    rows = [{"phase": k, "seconds": f"{v:.3f}"} for k, v in p.get("compile_phases", {}).items()]
    rows += [
        {"phase": f"{k} (when it was compiled and kept)", "seconds": f"{v:.3f}"}
        for k, v in (p.get("kept_phases") or {}).items()
    ]
    if p.get("compile_seconds") is not None:
        rows.append(
            {"phase": "total (as the worker waited)", "seconds": f"{p['compile_seconds']:.3f}"}
        )
    cache = p.get("cache")
    cache = "loaded as kept (gt's block cache)" if cache == "kept" else cache  # (block_cache)
    rows.append({"phase": "inductor's cache", "seconds": cache or "-"})
    return rows


def user_rows(u: dict) -> list[dict]:
    """A user's torch.compile: its compile ids and time split, each recompile with the guard
    that failed and its line, each graph break with its line, and what to do."""
    split = ", ".join(f"{k.removesuffix('_s')} {v:.3f} s" for k, v in u["time_split"].items())
    rows = [
        {"what": "compiles", "detail": f"{u['compiles']} ({u['compile_seconds']:.3f} s: {split})"},
        {"what": "compile ids", "detail": ", ".join(str(c) for c in u["compile_ids"])},
    ]
    calls = calls_text(u)
    if calls:
        rows.append({"what": "calls", "detail": calls})
    for r in u["recompiles"]:
        where = f" at {r['where']}: {r['source']}" if r.get("where") else ""
        rows.append(
            {"what": f"recompile {r['compile_id']}", "detail": f"failed guard {r['reason']}{where}"}
        )
        rows += [{"what": "", "detail": f"  {c}"} for c in cause_lines(r)]
    for b in u["graph_breaks"]:  # (the costliest first: see user_compiles._ranked)
        ran = (
            f"; in {b['calls']} compiled call(s), {b['outside_ms']:.3g} ms outside the graphs"
            if b.get("calls")
            else ""
        )
        rows.append(
            {
                "what": "graph break",
                "detail": f"{b['reason']} at {b['where']} (×{b['count']} traced{ran})",
            }
        )
        for f in b.get("stack", ()):  # the user's stack down to the break
            text = f" {f['text']}" if f["text"] else ""
            rows.append({"what": "", "detail": f"  {f['where']} in {f['function']}:{text}"})
    for x in u["explanations"]:
        rows.append({"what": "what to do", "detail": f"{x['cause']} -> {x['fix']}"})
    if u["limit_hit"]:
        rows.append({"what": "recompile limit", "detail": f"hit ({u['limit']})"})
    return rows


def _op_key(e: dict) -> str:
    """An op as the Diff aligns it: its name and arguments, a value it reads named only as an
    input or an op's result, not by its number (every op inserted before it shifts those)."""
    return repr((e["op"], _unnumbered(e["args"]), _unnumbered(e["kwargs"])))


def _unnumbered(a):
    if isinstance(a, str) and a.startswith("%"):
        return a.rstrip("0123456789")
    if isinstance(a, list | tuple):
        return [_unnumbered(x) for x in a]
    if isinstance(a, dict):
        return {k: _unnumbered(v) for k, v in a.items()}
    return a


def differing(a: dict, b: dict) -> tuple[str, set[str], set[str]]:
    """``%gt diff``'s words for two forms, and the nodes that differ on each side: ops by op
    and arguments, the two sequences aligned (difflib) so that one op inserted or removed
    marks that op alone, not every op after it; inputs by metadata."""
    oa, ob = _ops(a), _ops(b)
    da, db = set(), set()
    match = difflib.SequenceMatcher(None, [_op_key(x) for x in oa], [_op_key(y) for y in ob])
    for tag, i1, i2, j1, j2 in match.get_opcodes():
        if tag != "equal":
            da.update(f"op{k}" for k in range(i1, i2))
            db.update(f"op{k}" for k in range(j1, j2))
    ia = {i["name"]: i for i in a["inputs"]}
    for i in b["inputs"]:
        j = ia.get(i["name"])
        if j is None or any(i[f] != j[f] for f in ("shape", "dtype", "stride", "device")):
            db.add(i["name"])
            if j is not None:
                da.add(i["name"])
    return diff_text(a, b), da, db
