"""Figures: plain report data in, plotly figures out.

Each figure is computed as data first (``timeline_data``, ``prepare_graph``), then drawn
(``timeline``, ``graph``). Nothing here imports torch; plotly is imported only to draw.
"""

from __future__ import annotations

import statistics
from collections import Counter

import networkx as nx

from gt_core.observe import metrics
from gt_core.observe.graph import graph_of

__all__ = [
    "ALIAS_OPS",
    "MAX_NODES",
    "COLORS",
    "compiles",
    "compiles_data",
    "graph",
    "graph_of",
    "op_kind",
    "prepare_graph",
    "timeline",
    "timeline_data",
    "timeline_of",
]

# View and alias ops: they move no data, so a big graph reads better without them.
ALIAS_OPS = frozenset(
    {
        "t",
        "view",
        "_unsafe_view",
        "detach",
        "expand",
        "alias",
        "transpose",
        "permute",
        "unsqueeze",
        "squeeze",
        "as_strided",
    }
)
MAX_NODES = 150  # above this the graph hides alias ops, then merges op chains
LABEL_NODES = 60  # above this node labels move into the hover text only

COLORS = {
    "input": "#4C78A8",
    "op": "#F58518",
    "output": "#54A24B",
    "eager": "#4C78A8",
    "compiling": "#B279A2",
    "compiled": "#54A24B",
    "break_even": "#E45756",
    "window": "rgba(245, 133, 24, 0.15)",
    "edge": "rgba(128, 128, 128, 0.45)",
}

# Readable on light and dark notebook themes: transparent backgrounds, mid-grey ink.
_THEME = {
    "paper_bgcolor": "rgba(0,0,0,0)",
    "plot_bgcolor": "rgba(0,0,0,0)",
    "font": {"color": "#888888", "size": 12},
    "margin": {"l": 50, "r": 20, "t": 40, "b": 40},
}
_GRID = {"gridcolor": "rgba(128,128,128,0.25)", "zerolinecolor": "rgba(128,128,128,0.35)"}


# -- timeline: data ------------------------------------------------------------------------
def timeline_data(events: list[dict], signature: str, baseline_ms: float | None = None) -> dict:
    """One hot path's timeline as data (gt_core.observe.metrics.timeline): what is drawn."""
    return metrics.timeline(events, signature, baseline_ms)


def timeline_of(data: dict, signature: str) -> dict:
    """The timeline of a hot path of report ``data``, against the report's eager median."""
    path = next((p for p in data.get("hot_paths", []) if p["signature"] == signature), {})
    return metrics.timeline(data.get("events", []), signature, path.get("eager_median_ms"))


# -- timeline: drawing ---------------------------------------------------------------------
def _go():
    import plotly.graph_objects as go  # noqa: PLC0415 (drawing only)

    return go


def timeline(td: dict):
    """A plotly Figure of ``timeline_data``: traces eager, compiling, compiled, and the totals."""
    go = _go()
    fig = go.Figure()
    for kind, name in (
        ("eager", "eager"),
        ("compiling", "eager (compiling)"),
        ("compiled", "compiled"),
    ):
        pts = [(x, m) for x, k, m in zip(td["x"], td["kinds"], td["ms"], strict=False) if k == kind]
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in pts],
                y=[p[1] for p in pts],
                mode="markers",
                name=name,
                marker={"color": COLORS[kind], "size": 5},
                hovertemplate="iteration %{x}<br>%{y:.3g} ms<extra>" + name + "</extra>",
            )
        )
    for key, name, dash in (
        ("cum_eager", "total, eager only (est.)", "dot"),
        ("cum_gt", "total, with gt", "solid"),
    ):
        fig.add_trace(
            go.Scatter(
                x=td["x"],
                y=[v / 1000.0 for v in td[key]],
                mode="lines",
                name=name,
                yaxis="y2",
                line={
                    "color": COLORS["compiled" if key == "cum_gt" else "eager"],
                    "dash": dash,
                    "width": 1.5,
                },
                hovertemplate="iteration %{x}<br>%{y:.3g} s<extra>" + name + "</extra>",
            )
        )
    shapes, notes = _timeline_marks(td)
    title = (
        f"timeline {td['signature']}"
        if td["x"]
        else f"timeline {td['signature']}: no iterations yet"
    )
    if td.get("folded"):  # a long run: the middle is in the totals, not drawn point by point
        title += f" ({td['folded']} iterations between the first and the last not drawn)"
    fig.update_layout(
        **_THEME,
        title={"text": title, "font": {"size": 13}},
        height=320,
        xaxis={"title": "iteration", **_GRID},
        yaxis={"title": "ms per iteration", "rangemode": "tozero", **_GRID},
        yaxis2={
            "title": "total s",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
        },
        legend={"orientation": "h", "y": -0.25},
        shapes=shapes,
        annotations=notes,
    )
    return fig


def compiles_data(user_compiles: list[dict]) -> list[dict]:
    """One point per compile of the user's torch.compile'd functions, time from the first."""
    rows = [
        {"function": u["function"], **c, "limit_hit": u.get("limit_hit", False)}
        for u in user_compiles
        for c in u.get("timeline", [])
        if isinstance(c.get("t"), (int, float))
    ]
    t0 = min((r["t"] for r in rows), default=0.0)
    for r in rows:
        r["at_s"] = r["t"] - t0
        r["kind"] = (
            "recompile" if r.get("recompile") else ("resume" if r.get("resume") else "compile")
        )
    return sorted(rows, key=lambda r: r["t"])


def compiles(user_compiles: list[dict]):
    """A plotly Figure of the user's compiles: when each happened, how long it took, why."""
    rows = compiles_data(user_compiles)
    if not rows:
        return None
    go = _go()
    fig = go.Figure()
    symbols = {"compile": "circle", "recompile": "x", "resume": "triangle-right"}
    for u in user_compiles:
        mine = [r for r in rows if r["function"] == u["function"]]
        if not mine:
            continue
        fig.add_trace(
            go.Scatter(
                x=[r["at_s"] for r in mine],
                y=[r.get("seconds") or 0.0 for r in mine],
                mode="markers+lines",
                line={"width": 0.5, "dash": "dot"},
                name=u["function"],
                marker={"size": 9, "symbol": [symbols[r["kind"]] for r in mine]},
                text=[f"{r['kind']} {r.get('compile_id', '')}" for r in mine],
                hovertemplate="%{text}<br>at %{x:.2f} s, took %{y:.3g} s<extra>%{fullData.name}</extra>",
            )
        )
    notes = [
        {
            "x": max(r["at_s"] for r in rows if r["function"] == u["function"]),
            "y": 1.0,
            "yref": "paper",
            "text": f"{u['function']}: recompile limit hit, eager from here",
            "showarrow": False,
            "font": {"size": 11, "color": COLORS["break_even"]},
        }
        for u in user_compiles
        if u.get("limit_hit") and any(r["function"] == u["function"] for r in rows)
    ]
    fig.update_layout(
        **_THEME,
        title={
            "text": "torch.compile: compiles and recompiles (x: recompile)",
            "font": {"size": 13},
        },
        height=260,
        xaxis={"title": "seconds since the first compile", **_GRID},
        yaxis={"title": "compile s", "rangemode": "tozero", **_GRID},
        legend={"orientation": "h", "y": -0.35},
        annotations=notes,
    )
    return fig


def _timeline_marks(td: dict) -> tuple[list[dict], list[dict]]:
    shapes, notes = [], []
    if td["window"]:
        x0, x1 = td["window"]
        shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": x0,
                "x1": x1,
                "y0": 0,
                "y1": 1,
                "fillcolor": COLORS["window"],
                "line": {"width": 0},
                "layer": "below",
            }
        )
        text = td["window_label"] + (
            f" {td['compile_ms'] / 1000:.3g} s" if td["compile_ms"] else ""
        )
        notes.append(
            {
                "x": (x0 + x1) / 2,
                "y": 1,
                "xref": "x",
                "yref": "paper",
                "yanchor": "bottom",
                "text": text,
                "showarrow": False,
                "font": {"size": 11},
            }
        )
    if td["break_even"] is not None:
        x = td["break_even"]
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": x,
                "x1": x,
                "y0": 0,
                "y1": 1,
                "line": {"color": COLORS["break_even"], "dash": "dash", "width": 1.5},
            }
        )
        notes.append(
            {
                "x": x,
                "y": 0.9,
                "xref": "x",
                "yref": "paper",
                "xanchor": "left",
                "text": f" break-even at {x}",
                "showarrow": False,
                "font": {"color": COLORS["break_even"], "size": 11},
            }
        )
    if td["speedup"]:
        notes.append(
            {
                "x": 1,
                "y": 1,
                "xref": "paper",
                "yref": "paper",
                "xanchor": "right",
                "yanchor": "bottom",
                "text": f"steady state {td['speedup']:.2f}x ({td['baseline_ms']:.3g} → {td['steady_ms']:.3g} ms)",
                "showarrow": False,
                "font": {"size": 11},
            }
        )
    return shapes, notes


# -- dependency graph: data ----------------------------------------------------------------
def op_kind(node: dict) -> str | None:
    """``aten.view.default`` → ``view``: the op packet a node runs (None for inputs, outputs)."""
    op = node.get("op")
    if not op:
        return None
    parts = op.split(".")
    return parts[1] if parts[0] == "aten" and len(parts) > 1 else parts[0]


def prepare_graph(
    graph: dict, hide_ops=None, max_nodes: int = MAX_NODES
) -> tuple[nx.DiGraph, list[str]]:
    """A networkx DiGraph of the plain graph, simplified for drawing, and notes on what changed.

    ``hide_ops``: op kinds to drop (their inputs wired to their users); None hides
    ``ALIAS_OPS`` only when the graph has more than ``max_nodes`` nodes. If it is still too
    big, chains of single-use ops are merged into one node each.
    """
    g = nx.DiGraph()
    for node in graph.get("nodes", []):
        g.add_node(node["id"], **{k: v for k, v in node.items() if k != "id"})
    g.add_edges_from((u, v) for u, v in graph.get("edges", []) if u in g and v in g)
    notes = []
    hide = (
        (ALIAS_OPS if len(g) > max_nodes else frozenset())
        if hide_ops is None
        else frozenset(hide_ops)
    )
    hidden = Counter()
    for n in list(nx.topological_sort(g)) if hide else ():
        kind = op_kind(g.nodes[n])
        if g.nodes[n].get("kind") == "op" and kind in hide:
            g.add_edges_from((p, s) for p in g.predecessors(n) for s in g.successors(n))
            g.remove_node(n)
            hidden[kind] += 1
    if hidden:
        which = ", ".join(f"{k} ×{c}" for k, c in hidden.most_common())
        notes.append(f"hid {sum(hidden.values())} alias ops ({which})")
    if len(g) > max_nodes:
        merged = _merge_chains(g)
        if merged:
            notes.append(f"merged {merged} ops into chains")
    return g, notes


def _merge_chains(g: nx.DiGraph) -> int:
    """Fold each op whose only input comes from an op with no other user into that op."""
    merged = 0
    for v in list(nx.topological_sort(g)):
        preds = list(g.predecessors(v))
        if g.nodes[v].get("kind") != "op" or len(preds) != 1:
            continue
        u = preds[0]
        if g.nodes[u].get("kind") != "op" or g.out_degree(u) != 1:
            continue
        a, b = g.nodes[u], g.nodes[v]
        a["chain"] = a.get("chain", [a.get("label")]) + b.get("chain", [b.get("label")])
        a["label"] = f"{a['chain'][0]} … {a['chain'][-1]} ({len(a['chain'])})"
        a.update(
            freed=b.get("freed", False), shape=b.get("shape"), dtype=b.get("dtype"), op=b.get("op")
        )
        g.add_edges_from((u, w) for w in g.successors(v))
        g.remove_node(v)
        merged += 1
    return merged


def _layout(g: nx.DiGraph) -> dict:
    """Layers left to right (longest path from the inputs; outputs last), ordered by parents."""
    layer: dict = {}
    for n in nx.topological_sort(g):
        layer[n] = max((layer[p] + 1 for p in g.predecessors(n)), default=0)
    last = max(layer.values(), default=0)
    for n in g:
        if g.nodes[n].get("kind") == "output":
            layer[n] = last
        elif g.nodes[n].get("kind") == "input":
            layer[n] = 0
    columns: dict[int, list] = {}
    for n in g:
        columns.setdefault(layer[n], []).append(n)
    pos: dict = {}
    for x in sorted(columns):
        col = columns[x]
        # Order each column by the mean height of its parents: fewer crossings, cheaply.
        col.sort(
            key=lambda n: statistics.fmean(
                [pos[p][1] for p in g.predecessors(n) if p in pos] or [0.0]
            )
        )
        for k, n in enumerate(col):
            pos[n] = (float(x), (len(col) - 1) / 2 - k)
    return pos


# -- dependency graph: drawing -------------------------------------------------------------
def _hover(a: dict) -> str:
    lines = [f"<b>{a.get('label', '')}</b>"]
    if a.get("chain"):
        lines.append("ops: " + " → ".join(str(c) for c in a["chain"]))
    elif a.get("op"):
        lines.append(f"op: {a['op']}")
    if a.get("shape") is not None:
        lines.append(f"shape: {list(a['shape'])}")
    if a.get("dtype"):
        lines.append(f"dtype: {a['dtype']}")
    if a.get("freed"):
        lines.append("freed inside the block")
    return "<br>".join(lines)


def graph(
    graph_data: dict, title: str = "dependency graph", hide_ops=None, max_nodes: int = MAX_NODES
):
    """A plotly Figure of a hot path's dependency graph: inputs, ops and outputs by colour."""
    go = _go()
    g, notes = prepare_graph(graph_data, hide_ops, max_nodes)
    pos = _layout(g)
    ex, ey = [], []
    for u, v in g.edges():
        ex += [pos[u][0], pos[v][0], None]
        ey += [pos[u][1], pos[v][1], None]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=ex,
            y=ey,
            mode="lines",
            name="dependencies",
            hoverinfo="skip",
            line={"color": COLORS["edge"], "width": 1},
            showlegend=False,
        )
    )
    labels = len(g) <= LABEL_NODES
    for kind, name in (("input", "inputs"), ("op", "ops"), ("output", "outputs")):
        nodes = [n for n in g if g.nodes[n].get("kind") == kind]
        attrs = [g.nodes[n] for n in nodes]
        fig.add_trace(
            go.Scatter(
                x=[pos[n][0] for n in nodes],
                y=[pos[n][1] for n in nodes],
                mode="markers+text" if labels else "markers",
                name=name,
                text=[str(a.get("label", n)) for n, a in zip(nodes, attrs, strict=False)],
                textposition="top center",
                textfont={"size": 10},
                hovertext=[_hover(a) for a in attrs],
                hoverinfo="text",
                customdata=nodes,
                marker={
                    "color": COLORS[kind],
                    "size": 11 if kind == "op" else 9,
                    "symbol": ["circle-open" if a.get("freed") else "circle" for a in attrs],
                    "line": {"width": 2, "color": COLORS[kind]},
                },
            )
        )
    n_ops = sum(1 for n in g if g.nodes[n].get("kind") == "op")
    note = "; ".join(notes + ["open circles: freed inside the block"])
    depth = max((p[0] for p in pos.values()), default=0)
    tallest = max(Counter(p[0] for p in pos.values()).values(), default=1)
    fig.update_layout(
        **_THEME,
        title={"text": f"{title} ({n_ops} op nodes)", "font": {"size": 13}},
        height=int(min(700, max(320, 40 + 22 * tallest))),
        xaxis={"visible": False, "range": [-0.5, depth + 0.5]},
        yaxis={"visible": False},
        legend={"orientation": "h", "y": -0.08},
        annotations=[
            {
                "x": 0,
                "y": 1,
                "xref": "paper",
                "yref": "paper",
                "yanchor": "bottom",
                "xanchor": "left",
                "text": note,
                "showarrow": False,
                "font": {"size": 11},
            }
        ],
        hovermode="closest",
    )
    return fig
