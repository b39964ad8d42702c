"""The dependency graph of a hot path: plain graph data in, a plotly figure out.

The graph is prepared as data first (``prepare_graph``: aliases hidden, chains merged, laid
out), then drawn (``graph``). Nothing here imports torch; plotly is imported only to draw.
"""

from __future__ import annotations

import statistics
from collections import Counter

import networkx as nx

from gt_core.observe.graph import graph_of

from ._figures import COLORS, THEME, plotly_go

__all__ = ["ALIAS_OPS", "MAX_NODES", "graph", "graph_of", "op_kind", "prepare_graph"]

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
LABEL_NODES = 40  # above this node labels move into the hover text only (they would overlap)


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
    go = plotly_go()
    g, notes = prepare_graph(graph_data, hide_ops, max_nodes)
    pos = _layout(g)
    fig = go.Figure()
    fig.add_trace(_edge_trace(go, g, pos))
    labels = len(g) <= LABEL_NODES
    for kind, name in (("input", "inputs"), ("op", "ops"), ("output", "outputs")):
        fig.add_trace(_node_trace(go, g, pos, kind, name, labels))
    fig.update_layout(**_graph_layout(g, pos, notes, title))
    return fig


def _edge_trace(go, g: nx.DiGraph, pos: dict):
    """Every dependency as one line trace (segments split by None), without hover or legend."""
    ex, ey = [], []
    for u, v in g.edges():
        ex += [pos[u][0], pos[v][0], None]
        ey += [pos[u][1], pos[v][1], None]
    return go.Scatter(
        x=ex,
        y=ey,
        mode="lines",
        name="dependencies",
        hoverinfo="skip",
        line={"color": COLORS["edge"], "width": 1},
        showlegend=False,
    )


def _node_trace(go, g: nx.DiGraph, pos: dict, kind: str, name: str, labels: bool):
    """The nodes of one kind as markers (open when freed), labelled when ``labels``."""
    nodes = [n for n in g if g.nodes[n].get("kind") == kind]
    attrs = [g.nodes[n] for n in nodes]
    return go.Scatter(
        x=[pos[n][0] for n in nodes],
        y=[pos[n][1] for n in nodes],
        mode="markers+text" if labels else "markers",
        name=name,
        text=[str(a.get("label", n)) for n, a in zip(nodes, attrs, strict=False)],
        textposition="top center",
        textfont={"size": 10, "color": COLORS[kind]},
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


def _graph_layout(g: nx.DiGraph, pos: dict, notes: list[str], title: str) -> dict:
    """The title with the op count, a height for the tallest column, the notes above the plot."""
    n_ops = sum(1 for n in g if g.nodes[n].get("kind") == "op")
    note = "; ".join(notes + ["open circles: freed inside the block"])
    depth = max((p[0] for p in pos.values()), default=0)
    tallest = max(Counter(p[0] for p in pos.values()).values(), default=1)
    return {
        **THEME,
        "title": {"text": f"{title} ({n_ops} op nodes)", "font": {"size": 13}},
        "height": int(min(700, max(320, 40 + 22 * tallest))),
        "autosize": True,
        # a column's labels are centred on it: half a column of room each side keeps them in
        "xaxis": {"visible": False, "range": [-0.8, depth + 0.8]},
        "yaxis": {"visible": False},
        "legend": {"orientation": "h", "y": -0.08},
        "annotations": [
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
        "hovermode": "closest",
    }
