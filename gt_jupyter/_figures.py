"""Figures of time: a hot path's timeline and the kernel's own compiles, as plotly figures.

Each figure is computed as data first (``timeline_data``, ``compiles_data``), then drawn
(``timeline``, ``compiles``). Nothing here imports torch; plotly is imported only to draw.
The dependency graph's figure is in _graphs.py; both share the theme here.
"""

from __future__ import annotations

import math

from gt_core.observe import metrics

__all__ = [
    "COLORS",
    "compiles",
    "compiles_data",
    "timeline",
    "timeline_data",
    "timeline_of",
]

# -- the theme, shared with _graphs.py --------------------------------------------------
COLORS = {
    "input": "#4C78A8",
    "op": "#F58518",
    "output": "#54A24B",
    "eager": "#4C78A8",
    "compiling": "#B279A2",
    "compiled": "#54A24B",
    "break_even": "#E45756",
    "window": "rgba(178, 121, 162, 0.18)",
    "edge": "rgba(128, 128, 128, 0.45)",
}

# Readable on light and dark notebook themes: transparent backgrounds, mid-grey ink.
THEME = {
    "paper_bgcolor": "rgba(0,0,0,0)",
    "plot_bgcolor": "rgba(0,0,0,0)",
    "font": {"color": "#888888", "size": 12},
    "margin": {"l": 50, "r": 20, "t": 40, "b": 40},
}
GRID = {"gridcolor": "rgba(128,128,128,0.25)", "zerolinecolor": "rgba(128,128,128,0.35)"}


def plotly_go():
    """plotly.graph_objects, imported on the first drawing (loading the extension does not)."""
    import plotly.graph_objects as go  # noqa: PLC0415 (drawing only)

    return go


# -- timeline: data ------------------------------------------------------------------------
def timeline_data(events: list[dict], signature: str, baseline_ms: float | None = None) -> dict:
    """One hot path's timeline as data (gt_core.observe.metrics.timeline): what is drawn."""
    return metrics.timeline(events, signature, baseline_ms)


def timeline_of(data: dict, signature: str) -> dict:
    """The timeline of a hot path of report ``data``, against the report's eager median."""
    path = next((p for p in data.get("hot_paths", []) if p["signature"] == signature), {})
    return metrics.timeline(data.get("events", []), signature, path.get("eager_median_ms"))


# -- timeline: drawing ---------------------------------------------------------------------
MAX_POINTS = 400  # per trace: longer series keep each bucket's lowest and highest point
LIVE_POINTS = 200  # per trace in the images sent while a cell runs (each update re-sends it)
OUTLIER = 3.0  # a point above this many times the 95th percentile is drawn at the axis' top


def thin(xs: list, ys: list, limit: int = MAX_POINTS) -> tuple[list, list]:
    """At most ``limit`` points of a series: each bucket's lowest and highest (spikes stay)."""
    n = len(xs)
    if n <= limit:
        return list(xs), list(ys)
    per = math.ceil(n / (limit // 2))
    keep: list[int] = []
    for a in range(0, n, per):
        idx = range(a, min(a + per, n))
        lo, hi = min(idx, key=ys.__getitem__), max(idx, key=ys.__getitem__)
        keep += sorted({lo, hi})
    if keep[-1] != n - 1:
        keep.append(n - 1)
    return [xs[i] for i in keep], [ys[i] for i in keep]


def y_cap(values: list[float]) -> float | None:
    """The top of the ms axis when a few outliers would flatten every other point, else None."""
    finite = sorted(v for v in values if isinstance(v, (int, float)) and math.isfinite(v))
    if len(finite) < 20:
        return None
    p95 = finite[int(0.95 * (len(finite) - 1))]
    return p95 * OUTLIER if p95 > 0 and finite[-1] > p95 * OUTLIER else None


def timeline(td: dict, points: int = MAX_POINTS):
    """A plotly Figure of ``timeline_data``: traces eager, compiling, compiled, and the totals.

    Long runs are thinned per trace (``thin``); outliers beyond ``y_cap`` are drawn at the
    top of the axis as triangles, their real time in the hover text.
    """
    go = plotly_go()
    fig = go.Figure()
    cap = y_cap(td["ms"])
    for kind, name in (
        ("eager", "eager"),
        ("compiling", "eager (compiling)"),
        ("compiled", "compiled"),
    ):
        fig.add_trace(_iteration_trace(go, td, kind, name, cap, points))
    for key, name, dash in (
        ("cum_eager", "total, eager only (est.)", "dot"),
        ("cum_gt", "total, with gt", "solid"),
    ):
        fig.add_trace(_total_trace(go, td, key, name, dash, points))
    shapes, notes = _timeline_marks(td)
    fig.update_layout(**_timeline_layout(td, cap), shapes=shapes, annotations=notes)
    return fig


def _iteration_trace(go, td: dict, kind: str, name: str, cap: float | None, points: int):
    """The ms of each iteration of one kind as markers; those above ``cap`` drawn at the cap."""
    pts = [(x, m) for x, k, m in zip(td["x"], td["kinds"], td["ms"], strict=False) if k == kind]
    xs, ys = thin([p[0] for p in pts], [p[1] for p in pts], points)
    over = [cap is not None and y > cap for y in ys]
    marker = {"color": COLORS[kind], "size": 5}
    extra = {}
    if any(over):  # per-point marks only when something is clipped (smaller messages)
        marker["size"] = [8 if o else 5 for o in over]
        marker["symbol"] = ["triangle-up" if o else "circle" for o in over]
        extra["customdata"] = ys
    value = "%{customdata:.3g}" if extra else "%{y:.3g}"
    return go.Scatter(
        x=xs,
        y=[cap if o else y for y, o in zip(ys, over, strict=True)],
        mode="markers",
        name=name,
        marker=marker,
        hovertemplate="iteration %{x}<br>" + value + " ms<extra>" + name + "</extra>",
        **extra,
    )


def _total_trace(go, td: dict, key: str, name: str, dash: str, points: int):
    """A running total in seconds (``cum_eager`` or ``cum_gt``) as a line on the right axis."""
    xs, ys = thin(td["x"], [v / 1000.0 for v in td[key]], points)
    return go.Scatter(
        x=xs,
        y=ys,
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


def _timeline_layout(td: dict, cap: float | None) -> dict:
    """The timeline's title and axes: ms per iteration on the left, total s on the right."""
    title = (
        f"timeline {td['signature']}"
        if td["x"]
        else f"timeline {td['signature']}: no iterations yet"
    )
    if td.get("folded"):  # a long run: the middle is in the totals, not drawn point by point
        title += f" ({td['folded']} iterations between the first and the last not drawn)"
    if cap is not None:
        title += f"; ▲ above {cap:.3g} ms drawn at the top"
    yaxis = {"title": "ms per iteration", "rangemode": "tozero", **GRID}
    if cap is not None:
        yaxis["range"] = [0, cap * 1.05]
    return {
        **THEME,
        "title": {"text": title, "font": {"size": 13}},
        "height": 320,
        "autosize": True,
        "xaxis": {"title": "iteration", **GRID},
        "yaxis": yaxis,
        "yaxis2": {
            "title": "total s",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
        },
        "legend": {"orientation": "h", "y": -0.25},
    }


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
    go = plotly_go()
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
        **THEME,
        title={
            "text": "torch.compile: compiles and recompiles (x: recompile)",
            "font": {"size": 13},
        },
        height=260,
        xaxis={"title": "seconds since the first compile", **GRID},
        yaxis={"title": "compile s", "rangemode": "tozero", **GRID},
        legend={"orientation": "h", "y": -0.35},
        annotations=notes,
    )
    return fig


def _timeline_marks(td: dict) -> tuple[list[dict], list[dict]]:
    """The shapes and notes over a timeline: the compile window, the break-even, the speedup."""
    shapes, notes = [], []
    if td["window"]:
        shapes.append(_window_band(*td["window"]))
        notes.append(_window_note(td))
    if td["break_even"] is not None:
        shapes.append(_break_even_line(td["break_even"]))
        notes.append(_break_even_note(td["break_even"]))
    if td["speedup"]:
        notes.append(_speedup_note(td))
    return shapes, notes


def _window_band(x0, x1) -> dict:
    """The compile window: a band behind the points, across the iterations it spanned."""
    return {
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


def _window_note(td: dict) -> dict:
    """The compile window's label above its band, with the compile's seconds when known."""
    x0, x1 = td["window"]
    text = td["window_label"] + (f" {td['compile_ms'] / 1000:.3g} s" if td["compile_ms"] else "")
    return {
        "x": (x0 + x1) / 2,
        "y": 1,
        "xref": "x",
        "yref": "paper",
        "yanchor": "bottom",
        "text": text,
        "showarrow": False,
        "font": {"size": 11},
    }


def _break_even_line(x) -> dict:
    """A dashed vertical line at the first iteration from which gt's total stays below eager's."""
    return {
        "type": "line",
        "xref": "x",
        "yref": "paper",
        "x0": x,
        "x1": x,
        "y0": 0,
        "y1": 1,
        "line": {"color": COLORS["break_even"], "dash": "dash", "width": 1.5},
    }


def _break_even_note(x) -> dict:
    """The break-even line's label, right of the line near the top."""
    return {
        "x": x,
        "y": 0.9,
        "xref": "x",
        "yref": "paper",
        "xanchor": "left",
        "text": f" break-even at {x}",
        "showarrow": False,
        "font": {"color": COLORS["break_even"], "size": 11},
    }


def _speedup_note(td: dict) -> dict:
    """The steady-state speedup and medians, above the plot's top right corner."""
    return {
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
