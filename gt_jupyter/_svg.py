"""Static SVG of a plotly figure dict: what nbconvert and GitHub show when scripts are stripped.

Draws the part of plotly this package uses: scatter traces (lines, markers, text), linear x
and y axes (and a second y axis on the right), rect and line shapes, annotations, a title and
a legend. Plain data in (``fig.to_plotly_json()``), an SVG string out; no plotly, no torch.
Ink is ``currentColor`` so the figure reads on light and dark themes; hover text becomes
``<title>`` tooltips. Only presentation attributes, no CSS: sanitizers drop ``<style>``.
"""

from __future__ import annotations

import html
import math
import numbers
import re

__all__ = ["WIDTH", "nice_ticks", "svg"]

WIDTH = 720
PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#EECA3B")
MAX_MARKERS = 2000  # beyond this a trace's markers are one path of dots, without tooltips
DASHES = {"dot": "2,3", "dash": "6,4", "longdash": "10,5", "dashdot": "6,3,2,3"}
_RGBA = re.compile(r"rgba\(\s*([\d.]+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)\s*\)")
_FIELD = re.compile(r"%\{([\w.]+)(?::([^}]*))?\}")


# -- small helpers ---------------------------------------------------------------------------
def _num(v) -> float | None:
    """A finite float, or None for None, NaN, infinities and anything not a number."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _list(v) -> list:
    """A per-point array (list, tuple or numpy array) as a list; None as []."""
    return [] if v is None else list(v)


def _at(v, k: int, default=None):
    """Per-point attribute ``v`` (an array, or one value for all points) at point ``k``."""
    if hasattr(v, "__len__") and not isinstance(v, (str, dict)):
        v = v[k] if k < len(v) else None
    return default if v is None else v


def _esc(s) -> str:
    return html.escape(str(s), quote=True)


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _plain(s) -> str:
    """Plotly's rich text (``<b>``, ``<br>``) as plain lines."""
    s = re.sub(r"<br\s*/?>", "\n", str(s), flags=re.IGNORECASE)
    return html.unescape(re.sub(r"<[^>]+>", "", s))


def _text_width(text: str, size: float) -> float:
    return 0.55 * size * max((len(line) for line in text.split("\n")), default=0)


def _paint(color, attr: str) -> str:
    """``fill="#4C78A8"``; rgba() as rgb plus an opacity attribute (SVG 1.1 viewers lack rgba)."""
    if not color:
        return f'{attr}="currentColor"'
    m = _RGBA.fullmatch(str(color).strip())
    if m:
        r, g, b, a = m.groups()
        return f'{attr}="rgb({r},{g},{b})" {attr}-opacity="{float(a):g}"'
    return f'{attr}="{_esc(color)}"'


def _stroke(color, width: float, dash=None) -> str:
    out = f'{_paint(color, "stroke")} stroke-width="{width:g}"'
    if dash and dash != "solid":
        pattern = DASHES.get(dash) or ",".join(re.findall(r"[\d.]+", str(dash)))
        if pattern:
            out += f' stroke-dasharray="{pattern}"'
    return out


def _title(v) -> str:
    """A plotly title, given as a string or as ``{"text": ...}``."""
    return _plain(v.get("text") or "" if isinstance(v, dict) else v or "")


def _text(x: float, y: float, text: str, size: float = 11, anchor: str = "start", **attrs) -> str:
    """A ``<text>``; several lines become ``<tspan>``s. ``attrs`` are extra SVG attributes."""
    extra = "".join(f' {k.replace("_", "-")}="{_esc(v)}"' for k, v in attrs.items())
    lines = text.split("\n")
    head = f'<text x="{_f(x)}" y="{_f(y)}" font-size="{size:g}" text-anchor="{anchor}"{extra}>'
    if len(lines) == 1:
        return f"{head}{_esc(text)}</text>"
    spans = "".join(
        f'<tspan x="{_f(x)}" dy="{0 if i == 0 else size * 1.2:g}">{_esc(line)}</tspan>'
        for i, line in enumerate(lines)
    )
    return f"{head}{spans}</text>"


# -- axes ------------------------------------------------------------------------------------
def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values (steps of 1, 2 or 5 × 10^k) between ``lo`` and ``hi``."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9))
    k0 = math.ceil(lo / step - 1e-9)
    return [round(k * step, 12) for k in range(k0, math.floor(hi / step + 1e-9) + 1)]


def _tick_label(v: float, ticks: list[float]) -> str:
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else abs(v) or 1.0
    if v == 0:
        return "0"
    if abs(v) >= 1e6 or abs(v) < 1e-3:
        return f"{v:.3g}"
    return f"{v:.{max(0, -math.floor(math.log10(step) + 1e-9))}f}"


def _range(axis: dict, values: list[float]) -> tuple[float, float]:
    """The axis range: the layout's own if it gives one, else the data's, padded a little."""
    given = [_num(v) for v in axis.get("range") or ()]
    if len(given) == 2 and None not in given and given[0] != given[1]:
        return given[0], given[1]
    vs = [v for v in values if v is not None]
    if axis.get("rangemode") == "tozero":
        vs.append(0.0)
    if not vs:
        return 0.0, 1.0
    lo, hi = min(vs), max(vs)
    pad = (hi - lo) * 0.06 if hi > lo else (abs(lo) * 0.1 or 1.0)
    a, b = lo - pad, hi + pad
    if axis.get("rangemode") == "tozero" and lo >= 0:
        a = max(a, 0.0)
    return a, b


class _Axis:
    """One linear axis: its range, ticks and how a value maps to a pixel."""

    def __init__(self, spec: dict | None, values: list[float], pixels: int):
        self.spec = spec or {}
        self.visible = spec is not None and self.spec.get("visible", True) is not False
        self.lo, self.hi = _range(self.spec, values)
        ticks = nice_ticks(self.lo, self.hi, max(2, pixels // 50))  # a tick per ~50 px
        self.ticks = [t for t in ticks if self.lo <= t <= self.hi]
        self.labels = [_tick_label(t, self.ticks) for t in self.ticks]
        self.title = _title(self.spec.get("title"))

    def label_width(self) -> float:
        return max((_text_width(s, 11) for s in self.labels), default=0.0) if self.visible else 0

    def frac(self, v: float) -> float:
        return (v - self.lo) / (self.hi - self.lo)


# -- marks -----------------------------------------------------------------------------------
def _marker(x: float, y: float, size: float, color, symbol: str, line: dict, tip: str) -> str:
    r = max(size, 1.0) / 2
    open_ = symbol.endswith("-open")
    base = symbol.removesuffix("-open")
    edge = line.get("width") or (1.5 if open_ else 0)
    paint = 'fill="none"' if open_ else _paint(color, "fill")
    if edge:
        paint += " " + _stroke(line.get("color") or color, edge)
    tail = f"<title>{_esc(tip)}</title>" if tip else ""
    if base == "x":
        d = f"M{_f(x - r)},{_f(y - r)}L{_f(x + r)},{_f(y + r)}M{_f(x - r)},{_f(y + r)}L{_f(x + r)},{_f(y - r)}"
        return f'<path d="{d}" fill="none" {_stroke(color, max(r / 2, 1.5))}>{tail}</path>'
    if base.startswith("triangle") or base in ("square", "diamond"):
        k = 1.2 * r
        shape = {
            "triangle-right": [(-k, -k), (k, 0), (-k, k)],
            "triangle-left": [(k, -k), (-k, 0), (k, k)],
            "triangle-down": [(-k, -k), (k, -k), (0, k)],
            "square": [(-r, -r), (r, -r), (r, r), (-r, r)],
            "diamond": [(0, -k), (k, 0), (0, k), (-k, 0)],
        }.get(base, [(-k, k), (0, -k), (k, k)])
        pts = " ".join(f"{_f(x + dx)},{_f(y + dy)}" for dx, dy in shape)
        return f'<polygon points="{pts}" {paint}>{tail}</polygon>'
    return f'<circle cx="{_f(x)}" cy="{_f(y)}" r="{r:g}" {paint}>{tail}</circle>'


def _fill_template(tpl: str, vals: dict) -> str:
    def sub(m: re.Match) -> str:
        v = vals.get(m.group(1))
        if v is None:
            return ""
        try:
            return format(v, m.group(2)) if m.group(2) else (f"{v:g}" if _num(v) else str(v))
        except (ValueError, TypeError):
            return str(v)

    out = _FIELD.sub(sub, tpl)
    extra = re.search(r"<extra>(.*?)</extra>", out, flags=re.DOTALL)
    body = re.sub(r"<extra>.*?</extra>", "", out, flags=re.DOTALL)
    return _plain((extra.group(1) + "<br>" if extra and extra.group(1) else "") + body)


def _tip(t: dict, k: int, x: float, y: float) -> str:
    """What plotly shows on hover over point ``k``: hovertext, the template, or name and values."""
    if t.get("hoverinfo") in ("skip", "none"):
        return ""
    text = _at(t.get("text"), k)
    hover = _at(t.get("hovertext"), k)
    if hover:
        return _plain(hover)
    vals = {"x": x, "y": y, "text": text, "fullData.name": t.get("name")}
    if t.get("hovertemplate"):
        return _fill_template(str(_at(t["hovertemplate"], k, "")), vals)
    label = f"{t['name']}: " if t.get("name") else ""
    return _plain(f"{label}{x:g}, {y:g}" + (f"<br>{text}" if text else ""))


def _labels(t: dict, pts: list, sx, sy, taken: list) -> list[str]:
    """Point labels; one that would overlap a label already drawn is left to the tooltip."""
    font, marker = t.get("textfont") or {}, t.get("marker") or {}
    size = float(font.get("size") or 10)
    out = []
    for k, (x, y) in enumerate(pts):
        label = _plain(_at(t.get("text"), k, ""))
        if x is None or y is None or not label:
            continue
        where = str(_at(t.get("textposition"), k, "middle center")).split()
        r = float(_at(marker.get("size"), k, 6)) / 2 if "markers" in t.get("mode", "") else 0.0
        w = _text_width(label, size)
        left = sx(x) + {"left": -r - 2 - w, "right": r + 2}.get(where[-1], -w / 2)
        base = sy(y) + {"top": -r - 3, "bottom": r + size}.get(where[0], size * 0.35)
        box = (left, base - size, left + w, base)
        if any(b[0] < box[2] and box[0] < b[2] and b[1] < box[3] and box[1] < b[3] for b in taken):
            continue
        taken.append(box)
        out.append(_text(left, base, label, size, fill=font.get("color") or "currentColor"))
    return out


def _trace(t: dict, color: str, sx, sy, taken: list) -> str:
    """One scatter trace as a ``<g>``: a path for its lines, then markers, then text labels."""
    pts = [(_num(a), _num(b)) for a, b in zip(_list(t.get("x")), _list(t.get("y")), strict=False)]
    mode = t.get("mode") or ("lines+markers" if len(pts) < 20 else "lines")
    marker, line = t.get("marker") or {}, t.get("line") or {}
    mcolor = marker.get("color")
    lcolor = line.get("color") or (mcolor if isinstance(mcolor, str) else None) or color
    out = [f'<g data-trace="{_esc(t.get("name") or "")}">']
    if "lines" in mode:
        d, pen = [], False  # a None (or NaN) breaks the line, as in plotly
        for x, y in pts:
            if x is None or y is None:
                pen = False
                continue
            d.append(f"{'L' if pen else 'M'}{_f(sx(x))},{_f(sy(y))}")
            pen = True
        if any(s.startswith("L") for s in d):
            stroke = _stroke(lcolor, line.get("width", 2), line.get("dash"))
            out.append(f'<path d="{"".join(d)}" fill="none" {stroke} stroke-linejoin="round"/>')
    if "markers" in mode and len(pts) > MAX_MARKERS:  # round dots: small and quick to draw
        dots = "".join(f"M{_f(sx(x))},{_f(sy(y))}h0" for x, y in pts if None not in (x, y))
        pen = _stroke(_at(mcolor, 0, color), float(_at(marker.get("size"), 0, 6)))
        out.append(f'<path d="{dots}" fill="none" {pen} stroke-linecap="round"/>')
    elif "markers" in mode:
        for k, (x, y) in enumerate(pts):
            if x is None or y is None:
                continue
            out.append(
                _marker(
                    sx(x),
                    sy(y),
                    float(_at(marker.get("size"), k, 6)),
                    _at(mcolor, k, color),
                    str(_at(marker.get("symbol"), k, "circle")),
                    marker.get("line") or {},
                    _tip(t, k, x, y),
                )
            )
    if "text" in mode:
        out += _labels(t, pts, sx, sy, taken)
    return "".join(out) + "</g>"


def _legend_swatch(t: dict, color: str, x: float, y: float) -> str:
    mode = t.get("mode") or "lines+markers"
    marker, line = t.get("marker") or {}, t.get("line") or {}
    mcolor = marker.get("color")
    mcolor = mcolor if isinstance(mcolor, str) else color
    out = ""
    if "lines" in mode:
        stroke = _stroke(
            line.get("color") or mcolor, min(line.get("width", 2), 3), line.get("dash")
        )
        out += f'<path d="M{_f(x)},{_f(y)}h20" fill="none" {stroke}/>'
    if "markers" in mode:
        symbol = marker.get("symbol") or "circle"  # per point: its filled base shape
        symbol = symbol if isinstance(symbol, str) else symbol[0].removesuffix("-open")
        out += _marker(
            x + 10,
            y,
            min(float(_at(marker.get("size"), 0, 6)), 10),
            mcolor,
            symbol,
            marker.get("line") or {},
            "",
        )
    return out


def _legend(entries: list[tuple[dict, str]], left: float, width: float) -> tuple[list[list], int]:
    """Entries laid out in rows that fit ``width``: [[(trace, color, x offset), ...], ...]."""
    rows: list[list] = [[]]
    x = 0.0
    for t, color in entries:
        w = 26 + _text_width(_plain(t["name"]), 11) + 14
        if rows[-1] and x + w > width:
            rows.append([])
            x = 0.0
        rows[-1].append((t, color, left + x))
        x += w
    return rows, len(rows) if rows[0] else 0


# -- the figure ------------------------------------------------------------------------------
def _shape(s: dict, px, py) -> str:
    x0, x1, y0, y1 = (_num(s.get(k)) for k in ("x0", "x1", "y0", "y1"))
    if None in (x0, x1, y0, y1):
        return ""
    ax, bx = px(s.get("xref", "x"), x0), px(s.get("xref", "x"), x1)
    ay, by = py(s.get("yref", "y"), y0), py(s.get("yref", "y"), y1)
    line = s.get("line") or {}
    width = line.get("width", 2)
    if s.get("type") == "rect":
        edge = " " + _stroke(line.get("color"), width, line.get("dash")) if width else ""
        return (
            f'<rect x="{_f(min(ax, bx))}" y="{_f(min(ay, by))}" width="{_f(abs(bx - ax))}" '
            f'height="{_f(abs(by - ay))}" {_paint(s.get("fillcolor") or "none", "fill")}{edge}/>'
        )
    if s.get("type") == "line":
        stroke = _stroke(line.get("color"), width, line.get("dash"))
        return f'<line x1="{_f(ax)}" y1="{_f(ay)}" x2="{_f(bx)}" y2="{_f(by)}" {stroke}/>'
    return ""


def _annotation(a: dict, px, py, width: int) -> str:
    x, y = _num(a.get("x")), _num(a.get("y"))
    text = _plain(a.get("text", "")).strip("\n")
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
    w = _text_width(text, size)
    left = {"left": ax, "right": ax - w}.get(xanchor, ax - w / 2)
    left = min(max(left, 2.0), width - 2.0 - w)  # keep it inside the picture
    lines = text.count("\n") + 1
    yanchor = a.get("yanchor", "auto")
    if yanchor == "auto" and yref == "paper":
        yanchor = "top" if y >= 2 / 3 else "bottom" if y <= 1 / 3 else "middle"
    top = {"bottom": ay - 3 - lines * size * 1.2, "top": ay + 2}.get(
        yanchor, ay - lines * size * 0.6
    )
    return _text(left, top + size, text, size, "start", fill=font.get("color") or "currentColor")


def svg(fig: dict, width: int = WIDTH) -> str:
    """An inline ``<svg>`` of plotly figure dict ``fig`` (scatter traces, linear axes only)."""
    layout = fig.get("layout") or {}
    traces = [
        t
        for t in fig.get("data") or []
        if t.get("type", "scatter") == "scatter" and t.get("visible", True) is not False
    ]
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(traces))]
    height = int(layout.get("height") or 320)
    title = _title(layout.get("title"))
    notes_above = any(
        a.get("yref") == "paper" and (_num(a.get("y")) or 0) >= 1
        for a in layout.get("annotations") or ()
    )
    has = {t_id: [t for t in traces if (t.get("yaxis") or "y") == t_id] for t_id in ("y", "y2")}
    xs = [_num(v) for t in traces for v in _list(t.get("x"))]
    ys = {k: [_num(v) for t in ts for v in _list(t.get("y"))] for k, ts in has.items()}
    for s in layout.get("shapes") or ():
        if s.get("xref", "x") == "x":
            xs += [_num(s.get("x0")), _num(s.get("x1"))]
        if s.get("yref", "y") in ys:
            ys[s.get("yref", "y")] += [_num(s.get("y0")), _num(s.get("y1"))]
    for a in layout.get("annotations") or ():
        if a.get("xref", "x") == "x":
            xs.append(_num(a.get("x")))

    entries = [
        (t, c)
        for t, c in zip(traces, colors, strict=False)
        if t.get("name")
        and t.get("showlegend", True) is not False
        and any(
            _num(a) is not None and _num(b) is not None
            for a, b in zip(_list(t.get("x")), _list(t.get("y")), strict=False)
        )
    ]
    # Vertical bands: title, notes above the plot, the plot, tick labels, x title, legend.
    top = (24 if title else 6) + (18 if notes_above else 0)
    rows, n_rows = _legend(entries, 10, width - 20)
    xspec = layout.get("xaxis") or {}
    xvisible = xspec.get("visible", True) is not False
    bottom = (20 + (18 if _title(xspec.get("title")) else 0) if xvisible else 6) + 18 * n_rows + 6
    plot_h = max(height - top - bottom, 120)
    height = top + plot_h + bottom
    y1 = _Axis(layout.get("yaxis") or {}, ys["y"], plot_h)
    y2 = (
        _Axis(layout.get("yaxis2"), ys["y2"], plot_h) if has["y2"] or layout.get("yaxis2") else None
    )
    left = 10 + (y1.label_width() + 8 + (18 if y1.title and y1.visible else 0) if y1.visible else 0)
    right = 16 + (y2.label_width() + 8 + (18 if y2.title else 0) if y2 and y2.visible else 0)
    plot_w = max(width - left - right, 120)
    x = _Axis(xspec, xs, int(plot_w))

    def sx(v: float) -> float:
        return left + x.frac(v) * plot_w

    def sy_of(axis: _Axis):
        return lambda v: top + (1 - axis.frac(v)) * plot_h

    def px(ref: str, v: float) -> float:
        return left + v * plot_w if ref == "paper" else sx(v)

    def py(ref: str, v: float) -> float:
        if ref == "paper":
            return top + (1 - v) * plot_h
        return sy_of(y2 if ref == "y2" and y2 else y1)(v)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" fill="currentColor" '
        f'role="img" aria-label="{_esc(title or "figure")}" style="max-width:100%;height:auto">'
    ]
    out += _axes(x, y1, y2, left, top, plot_w, plot_h, width)
    shapes, taken = layout.get("shapes") or [], []
    out += [_shape(s, px, py) for s in shapes if s.get("layer") == "below"]
    for t, c in zip(traces, colors, strict=False):
        out.append(_trace(t, c, sx, sy_of(y2 if t.get("yaxis") == "y2" and y2 else y1), taken))
    out += [_shape(s, px, py) for s in shapes if s.get("layer") != "below"]
    out += [_annotation(a, px, py, width) for a in layout.get("annotations") or ()]
    if not any(x is not None for x in xs):
        out.append(
            _text(left + plot_w / 2, top + plot_h / 2, "no data", 12, "middle", fill_opacity=0.6)
        )
    if title:
        spec = layout["title"] if isinstance(layout["title"], dict) else {}
        size = float((spec.get("font") or {}).get("size") or 13)
        out.append(_text(10, 17, title, size, "start", font_weight="600"))
    base = height - 18 * n_rows - 2
    for i, row in enumerate(rows if n_rows else []):
        for t, c, lx in row:
            ly = base + 18 * i + 9
            out.append(_legend_swatch(t, c, lx, ly))
            out.append(_text(lx + 26, ly + 4, _plain(t["name"]), 11))
    return "".join(out) + "</svg>"


def _axes(x: _Axis, y1: _Axis, y2: _Axis | None, left, top, w, h, width) -> list[str]:
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
                    f'<line x1="{_f(px)}" y1="{_f(top)}" x2="{_f(px)}" y2="{_f(bottom)}" {grid}/>'
                )
            out.append(_text(px, bottom + 15, s, 11, "middle", fill_opacity=0.8))
        out.append(
            f'<line x1="{_f(left)}" y1="{_f(bottom)}" x2="{_f(left + w)}" y2="{_f(bottom)}" {ink}/>'
        )
        if x.title:
            out.append(_text(left + w / 2, bottom + 33, x.title, 12, "middle"))
    for axis, side in ((y1, "left"), (y2, "right")):
        if axis is None or not axis.visible:
            continue
        edge = left if side == "left" else left + w
        for t, s in zip(axis.ticks, axis.labels, strict=False):
            py = top + (1 - axis.frac(t)) * h
            if side == "left" and axis.spec.get("showgrid", True) is not False:
                out.append(
                    f'<line x1="{_f(left)}" y1="{_f(py)}" x2="{_f(left + w)}" y2="{_f(py)}" {grid}/>'
                )
            lx, anchor = (edge - 6, "end") if side == "left" else (edge + 6, "start")
            out.append(_text(lx, py + 4, s, 11, anchor, fill_opacity=0.8))
        out.append(
            f'<line x1="{_f(edge)}" y1="{_f(top)}" x2="{_f(edge)}" y2="{_f(bottom)}" {ink}/>'
        )
        if axis.title:
            tx = 14 if side == "left" else width - 8
            out.append(
                _text(
                    tx,
                    top + h / 2,
                    axis.title,
                    12,
                    "middle",
                    transform=f"rotate(-90 {tx} {_f(top + h / 2)})",
                )
            )
    return out
