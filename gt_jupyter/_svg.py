"""Static SVG of a plotly figure dict: what nbconvert and GitHub show when scripts are stripped.

Draws the part of plotly this package uses: scatter traces (lines, markers, text), linear x
and y axes (and a second y axis on the right), rect and line shapes, annotations, a title and
a legend. Plain data in (``fig.to_plotly_json()``), an SVG string out; no plotly, no torch.
Ink is ``currentColor`` so the figure reads on light and dark themes; hover text becomes
``<title>`` tooltips. Only presentation attributes, no CSS: sanitizers drop ``<style>``.
"""

from __future__ import annotations

from ._svg_marks import (
    Axis,
    as_list,
    esc,
    fmt,
    legend_rows,
    legend_swatch,
    num,
    paint_attr,
    plain_text,
    stroke_attr,
    text_el,
    text_width,
    title_of,
    trace_el,
)

__all__ = ["WIDTH", "svg"]

WIDTH = 720
PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#EECA3B")


# -- the figure ------------------------------------------------------------------------------
def _shape(s: dict, px, py) -> str:
    x0, x1, y0, y1 = (num(s.get(k)) for k in ("x0", "x1", "y0", "y1"))
    if None in (x0, x1, y0, y1):
        return ""
    ax, bx = px(s.get("xref", "x"), x0), px(s.get("xref", "x"), x1)
    ay, by = py(s.get("yref", "y"), y0), py(s.get("yref", "y"), y1)
    line = s.get("line") or {}
    width = line.get("width", 2)
    if s.get("type") == "rect":
        edge = " " + stroke_attr(line.get("color"), width, line.get("dash")) if width else ""
        return (
            f'<rect x="{fmt(min(ax, bx))}" y="{fmt(min(ay, by))}" width="{fmt(abs(bx - ax))}" '
            f'height="{fmt(abs(by - ay))}" {paint_attr(s.get("fillcolor") or "none", "fill")}{edge}/>'
        )
    if s.get("type") == "line":
        stroke = stroke_attr(line.get("color"), width, line.get("dash"))
        return f'<line x1="{fmt(ax)}" y1="{fmt(ay)}" x2="{fmt(bx)}" y2="{fmt(by)}" {stroke}/>'
    return ""


def _annotation(a: dict, px, py, width: int) -> str:
    x, y = num(a.get("x")), num(a.get("y"))
    text = plain_text(a.get("text", "")).strip("\n")
    if x is None or y is None or not text.strip():
        return ""
    font = a.get("font") or {}
    size = float(font.get("size") or 11)
    xref, yref = a.get("xref", "x"), a.get("yref", "y")
    xanchor = a.get("xanchor", "auto")
    if xanchor == "auto":  # plotly's rule for paper positions; data positions centre
        xanchor = (
            "center" if xref != "paper" or 1 / 3 < x < 2 / 3 else "left" if x <= 1 / 3 else "right"
        )
    ax, ay = px(xref, x), py(yref, y)
    w = text_width(text, size)
    left = {"left": ax, "right": ax - w}.get(xanchor, ax - w / 2)
    left = min(max(left, 2.0), width - 2.0 - w)  # keep it inside the picture
    lines = text.count("\n") + 1
    yanchor = a.get("yanchor", "auto")
    if yanchor == "auto" and yref == "paper":
        yanchor = "top" if y >= 2 / 3 else "bottom" if y <= 1 / 3 else "middle"
    top = {"bottom": ay - 3 - lines * size * 1.2, "top": ay + 2}.get(
        yanchor, ay - lines * size * 0.6
    )
    return text_el(left, top + size, text, size, "start", fill=font.get("color") or "currentColor")


def svg(fig: dict, width: int = WIDTH) -> str:
    """An inline ``<svg>`` of plotly figure dict ``fig`` (scatter traces, linear axes only)."""
    layout = fig.get("layout") or {}
    traces = [
        t
        for t in fig.get("data") or []
        if t.get("type", "scatter") == "scatter" and t.get("visible", True) is not False
    ]
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(traces))]
    title = title_of(layout.get("title"))
    xs, ys = _extents(traces, layout)
    f = _Frame(layout, traces, title, xs, ys, _legend_entries(traces, colors), width)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{f.height}" '
        f'viewBox="0 0 {width} {f.height}" font-family="sans-serif" fill="currentColor" '
        f'role="img" aria-label="{esc(title or "figure")}" style="max-width:100%;height:auto">'
    ]
    out += _axes(f.x, f.y1, f.y2, f.left, f.top, f.plot_w, f.plot_h, width)
    out += _marks(layout, traces, colors, f, width)
    if not any(x is not None for x in xs):
        out.append(
            text_el(
                f.left + f.plot_w / 2,
                f.top + f.plot_h / 2,
                "no data",
                12,
                "middle",
                fill_opacity=0.6,
            )
        )
    if title:
        spec = layout["title"] if isinstance(layout["title"], dict) else {}
        size = float((spec.get("font") or {}).get("size") or 13)
        out.append(text_el(10, 17, title, size, "start", font_weight="600"))
    out += _legend(f.rows, f.n_rows, f.height)
    return "".join(out) + "</svg>"


def _extents(traces: list[dict], layout: dict) -> tuple[list, dict[str, list]]:
    """The x values, and the y values of each y axis, that the axes' ranges must hold.

    The traces' points, the shapes' corners placed on the data and the x of annotations
    placed on the data (paper positions need no room on an axis).
    """
    xs = [num(v) for t in traces for v in as_list(t.get("x"))]
    ys = {
        k: [num(v) for t in traces if (t.get("yaxis") or "y") == k for v in as_list(t.get("y"))]
        for k in ("y", "y2")
    }
    for s in layout.get("shapes") or ():
        if s.get("xref", "x") == "x":
            xs += [num(s.get("x0")), num(s.get("x1"))]
        if s.get("yref", "y") in ys:
            ys[s.get("yref", "y")] += [num(s.get("y0")), num(s.get("y1"))]
    for a in layout.get("annotations") or ():
        if a.get("xref", "x") == "x":
            xs.append(num(a.get("x")))
    return xs, ys


def _legend_entries(traces: list[dict], colors: list[str]) -> list[tuple[dict, str]]:
    """The traces the legend lists, with their colours: named, shown, with a point to draw."""
    return [
        (t, c)
        for t, c in zip(traces, colors, strict=False)
        if t.get("name")
        and t.get("showlegend", True) is not False
        and any(
            num(a) is not None and num(b) is not None
            for a, b in zip(as_list(t.get("x")), as_list(t.get("y")), strict=False)
        )
    ]


class _Frame:
    """Where the plot sits in the picture, and how a data or paper position maps to a pixel.

    Vertical bands: title, notes above the plot, the plot, tick labels, x title, legend;
    the y axes' tick labels and titles take room left and right of the plot.
    """

    def __init__(self, layout, traces, title, xs, ys, entries, width: int):
        notes_above = any(
            a.get("yref") == "paper" and (num(a.get("y")) or 0) >= 1
            for a in layout.get("annotations") or ()
        )
        self.top = (24 if title else 6) + (18 if notes_above else 0)
        self.rows, self.n_rows = legend_rows(entries, 10, width - 20)
        xspec = layout.get("xaxis") or {}
        xvisible = xspec.get("visible", True) is not False
        xtitle = 18 if title_of(xspec.get("title")) else 0
        bottom = (20 + xtitle if xvisible else 6) + 18 * self.n_rows + 6
        self.plot_h = max(int(layout.get("height") or 320) - self.top - bottom, 120)
        self.height = self.top + self.plot_h + bottom
        on_y2 = any((t.get("yaxis") or "y") == "y2" for t in traces)
        y1 = self.y1 = Axis(layout.get("yaxis") or {}, ys["y"], self.plot_h)
        y2 = self.y2 = (
            Axis(layout.get("yaxis2"), ys["y2"], self.plot_h)
            if on_y2 or layout.get("yaxis2")
            else None
        )
        self.left = 10 + (
            y1.label_width() + 8 + (18 if y1.title and y1.visible else 0) if y1.visible else 0
        )
        right = 16 + (y2.label_width() + 8 + (18 if y2.title else 0) if y2 and y2.visible else 0)
        self.plot_w = max(width - self.left - right, 120)
        self.x = Axis(xspec, xs, int(self.plot_w))

    def sx(self, v: float) -> float:
        return self.left + self.x.frac(v) * self.plot_w

    def sy_of(self, axis: Axis):
        return lambda v: self.top + (1 - axis.frac(v)) * self.plot_h

    def y_axis(self, ref) -> Axis:
        """The y axis a trace or mark names: the second only where there is one."""
        return self.y2 if ref == "y2" and self.y2 else self.y1

    def px(self, ref: str, v: float) -> float:
        return self.left + v * self.plot_w if ref == "paper" else self.sx(v)

    def py(self, ref: str, v: float) -> float:
        if ref == "paper":
            return self.top + (1 - v) * self.plot_h
        return self.sy_of(self.y_axis(ref))(v)


def _marks(layout: dict, traces: list[dict], colors: list[str], f: _Frame, width) -> list[str]:
    """Shapes below the traces, the traces, the other shapes over them, then the annotations."""
    shapes, taken = layout.get("shapes") or [], []
    out = [_shape(s, f.px, f.py) for s in shapes if s.get("layer") == "below"]
    for t, c in zip(traces, colors, strict=False):
        out.append(trace_el(t, c, f.sx, f.sy_of(f.y_axis(t.get("yaxis"))), taken))
    out += [_shape(s, f.px, f.py) for s in shapes if s.get("layer") != "below"]
    out += [_annotation(a, f.px, f.py, width) for a in layout.get("annotations") or ()]
    return out


def _legend(rows: list[list], n_rows: int, height) -> list[str]:
    """The legend's rows along the bottom: each entry a swatch and its name."""
    out = []
    base = height - 18 * n_rows - 2
    for i, row in enumerate(rows if n_rows else []):
        for t, c, lx in row:
            ly = base + 18 * i + 9
            out.append(legend_swatch(t, c, lx, ly))
            out.append(text_el(lx + 26, ly + 4, plain_text(t["name"]), 11))
    return out


def _axes(x: Axis, y1: Axis, y2: Axis | None, left, top, w, h, width) -> list[str]:
    """Grid lines, axis lines, tick labels and axis titles, all in ``currentColor``."""
    out = []
    grid = 'stroke="currentColor" stroke-opacity="0.15" stroke-width="1"'
    ink = 'stroke="currentColor" stroke-opacity="0.5" stroke-width="1"'
    bottom = top + h
    if x.visible:
        for t, s in zip(x.ticks, x.labels, strict=False):
            px = left + x.frac(t) * w
            if x.spec.get("showgrid", True) is not False:
                out.append(
                    f'<line x1="{fmt(px)}" y1="{fmt(top)}" x2="{fmt(px)}" y2="{fmt(bottom)}" {grid}/>'
                )
            out.append(text_el(px, bottom + 15, s, 11, "middle", fill_opacity=0.8))
        out.append(
            f'<line x1="{fmt(left)}" y1="{fmt(bottom)}" x2="{fmt(left + w)}" y2="{fmt(bottom)}" {ink}/>'
        )
        if x.title:
            out.append(text_el(left + w / 2, bottom + 33, x.title, 12, "middle"))
    for axis, side in ((y1, "left"), (y2, "right")):
        if axis is None or not axis.visible:
            continue
        edge = left if side == "left" else left + w
        for t, s in zip(axis.ticks, axis.labels, strict=False):
            py = top + (1 - axis.frac(t)) * h
            if side == "left" and axis.spec.get("showgrid", True) is not False:
                out.append(
                    f'<line x1="{fmt(left)}" y1="{fmt(py)}" x2="{fmt(left + w)}" y2="{fmt(py)}" {grid}/>'
                )
            lx, anchor = (edge - 6, "end") if side == "left" else (edge + 6, "start")
            out.append(text_el(lx, py + 4, s, 11, anchor, fill_opacity=0.8))
        out.append(
            f'<line x1="{fmt(edge)}" y1="{fmt(top)}" x2="{fmt(edge)}" y2="{fmt(bottom)}" {ink}/>'
        )
        if axis.title:
            tx = 14 if side == "left" else width - 8
            out.append(
                text_el(
                    tx,
                    top + h / 2,
                    axis.title,
                    12,
                    "middle",
                    transform=f"rotate(-90 {tx} {fmt(top + h / 2)})",
                )
            )
    return out
