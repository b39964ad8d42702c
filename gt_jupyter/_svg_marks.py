"""SVG primitives for _svg.py: numbers and text, a linear axis, scatter marks and the legend.

Each returns SVG markup as a string (or, for ``Axis``, how values map to pixels). Ink is
``currentColor``; hover text becomes ``<title>`` tooltips; only presentation attributes, no
CSS (sanitizers drop ``<style>``).
"""

from __future__ import annotations

import html
import math
import numbers
import re

__all__ = [
    "Axis",
    "as_list",
    "esc",
    "fmt",
    "legend_rows",
    "legend_swatch",
    "nice_ticks",
    "num",
    "paint_attr",
    "plain_text",
    "stroke_attr",
    "text_el",
    "text_width",
    "title_of",
    "trace_el",
]

MAX_MARKERS = 2000  # beyond this a trace's markers are one path of dots, without tooltips
DASHES = {"dot": "2,3", "dash": "6,4", "longdash": "10,5", "dashdot": "6,3,2,3"}
_RGBA = re.compile(r"rgba\(\s*([\d.]+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)\s*\)")
_FIELD = re.compile(r"%\{([\w.]+)(?::([^}]*))?\}")


# -- small helpers ---------------------------------------------------------------------------
def num(v) -> float | None:
    """A finite float, or None for None, NaN, infinities and anything not a number."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def as_list(v) -> list:
    """A per-point array (list, tuple or numpy array) as a list; None as []."""
    return [] if v is None else list(v)


def _at(v, k: int, default=None):
    """Per-point attribute ``v`` (an array, or one value for all points) at point ``k``."""
    if hasattr(v, "__len__") and not isinstance(v, (str, dict)):
        v = v[k] if k < len(v) else None
    return default if v is None else v


def esc(s) -> str:
    return html.escape(str(s), quote=True)


def fmt(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def plain_text(s) -> str:
    """Plotly's rich text (``<b>``, ``<br>``) as plain lines."""
    s = re.sub(r"<br\s*/?>", "\n", str(s), flags=re.IGNORECASE)
    return html.unescape(re.sub(r"<[^>]+>", "", s))


def text_width(text: str, size: float) -> float:
    return 0.55 * size * max((len(line) for line in text.split("\n")), default=0)


def paint_attr(color, attr: str) -> str:
    """``fill="#4C78A8"``; rgba() as rgb plus an opacity attribute (SVG 1.1 viewers lack rgba)."""
    if not color:
        return f'{attr}="currentColor"'
    m = _RGBA.fullmatch(str(color).strip())
    if m:
        r, g, b, a = m.groups()
        return f'{attr}="rgb({r},{g},{b})" {attr}-opacity="{float(a):g}"'
    return f'{attr}="{esc(color)}"'


def stroke_attr(color, width: float, dash=None) -> str:
    out = f'{paint_attr(color, "stroke")} stroke-width="{width:g}"'
    if dash and dash != "solid":
        pattern = DASHES.get(dash) or ",".join(re.findall(r"[\d.]+", str(dash)))
        if pattern:
            out += f' stroke-dasharray="{pattern}"'
    return out


def title_of(v) -> str:
    """A plotly title, given as a string or as ``{"text": ...}``."""
    return plain_text(v.get("text") or "" if isinstance(v, dict) else v or "")


def text_el(x: float, y: float, text: str, size: float = 11, anchor: str = "start", **attrs) -> str:
    """A ``<text>``; several lines become ``<tspan>``s. ``attrs`` are extra SVG attributes."""
    extra = "".join(f' {k.replace("_", "-")}="{esc(v)}"' for k, v in attrs.items())
    lines = text.split("\n")
    head = f'<text x="{fmt(x)}" y="{fmt(y)}" font-size="{size:g}" text-anchor="{anchor}"{extra}>'
    if len(lines) == 1:
        return f"{head}{esc(text)}</text>"
    spans = "".join(
        f'<tspan x="{fmt(x)}" dy="{0 if i == 0 else size * 1.2:g}">{esc(line)}</tspan>'
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
    given = [num(v) for v in axis.get("range") or ()]
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


class Axis:
    """One linear axis: its range, ticks and how a value maps to a pixel."""

    def __init__(self, spec: dict | None, values: list[float], pixels: int):
        self.spec = spec or {}
        self.visible = spec is not None and self.spec.get("visible", True) is not False
        self.lo, self.hi = _range(self.spec, values)
        ticks = nice_ticks(self.lo, self.hi, max(2, pixels // 50))  # a tick per ~50 px
        self.ticks = [t for t in ticks if self.lo <= t <= self.hi]
        self.labels = [_tick_label(t, self.ticks) for t in self.ticks]
        self.title = title_of(self.spec.get("title"))

    def label_width(self) -> float:
        return max((text_width(s, 11) for s in self.labels), default=0.0) if self.visible else 0

    def frac(self, v: float) -> float:
        return (v - self.lo) / (self.hi - self.lo)


# -- marks -----------------------------------------------------------------------------------
def _marker(x: float, y: float, size: float, color, symbol: str, line: dict, tip: str) -> str:
    r = max(size, 1.0) / 2
    open_ = symbol.endswith("-open")
    base = symbol.removesuffix("-open")
    edge = line.get("width") or (1.5 if open_ else 0)
    paint = 'fill="none"' if open_ else paint_attr(color, "fill")
    if edge:
        paint += " " + stroke_attr(line.get("color") or color, edge)
    tail = f"<title>{esc(tip)}</title>" if tip else ""
    if base == "x":
        d = f"M{fmt(x - r)},{fmt(y - r)}L{fmt(x + r)},{fmt(y + r)}M{fmt(x - r)},{fmt(y + r)}L{fmt(x + r)},{fmt(y - r)}"
        return f'<path d="{d}" fill="none" {stroke_attr(color, max(r / 2, 1.5))}>{tail}</path>'
    if base.startswith("triangle") or base in ("square", "diamond"):
        k = 1.2 * r
        shape = {
            "triangle-right": [(-k, -k), (k, 0), (-k, k)],
            "triangle-left": [(k, -k), (-k, 0), (k, k)],
            "triangle-down": [(-k, -k), (k, -k), (0, k)],
            "square": [(-r, -r), (r, -r), (r, r), (-r, r)],
            "diamond": [(0, -k), (k, 0), (0, k), (-k, 0)],
        }.get(base, [(-k, k), (0, -k), (k, k)])
        pts = " ".join(f"{fmt(x + dx)},{fmt(y + dy)}" for dx, dy in shape)
        return f'<polygon points="{pts}" {paint}>{tail}</polygon>'
    return f'<circle cx="{fmt(x)}" cy="{fmt(y)}" r="{r:g}" {paint}>{tail}</circle>'


def _fill_template(tpl: str, vals: dict) -> str:
    def sub(m: re.Match) -> str:
        v = vals.get(m.group(1))
        if v is None:
            return ""
        try:
            return format(v, m.group(2)) if m.group(2) else (f"{v:g}" if num(v) else str(v))
        except (ValueError, TypeError):
            return str(v)

    out = _FIELD.sub(sub, tpl)
    extra = re.search(r"<extra>(.*?)</extra>", out, flags=re.DOTALL)
    body = re.sub(r"<extra>.*?</extra>", "", out, flags=re.DOTALL)
    return plain_text((extra.group(1) + "<br>" if extra and extra.group(1) else "") + body)


def _tip(t: dict, k: int, x: float, y: float) -> str:
    """What plotly shows on hover over point ``k``: hovertext, the template, or name and values."""
    if t.get("hoverinfo") in ("skip", "none"):
        return ""
    text = _at(t.get("text"), k)
    hover = _at(t.get("hovertext"), k)
    if hover:
        return plain_text(hover)
    vals = {"x": x, "y": y, "text": text, "fullData.name": t.get("name")}
    if t.get("hovertemplate"):
        return _fill_template(str(_at(t["hovertemplate"], k, "")), vals)
    label = f"{t['name']}: " if t.get("name") else ""
    return plain_text(f"{label}{x:g}, {y:g}" + (f"<br>{text}" if text else ""))


def _labels(t: dict, pts: list, sx, sy, taken: list) -> list[str]:
    """Point labels; one that would overlap a label already drawn is left to the tooltip."""
    font, marker = t.get("textfont") or {}, t.get("marker") or {}
    size = float(font.get("size") or 10)
    out = []
    for k, (x, y) in enumerate(pts):
        label = plain_text(_at(t.get("text"), k, ""))
        if x is None or y is None or not label:
            continue
        where = str(_at(t.get("textposition"), k, "middle center")).split()
        r = float(_at(marker.get("size"), k, 6)) / 2 if "markers" in t.get("mode", "") else 0.0
        w = text_width(label, size)
        left = sx(x) + {"left": -r - 2 - w, "right": r + 2}.get(where[-1], -w / 2)
        base = sy(y) + {"top": -r - 3, "bottom": r + size}.get(where[0], size * 0.35)
        box = (left, base - size, left + w, base)
        if any(b[0] < box[2] and box[0] < b[2] and b[1] < box[3] and box[1] < b[3] for b in taken):
            continue
        taken.append(box)
        out.append(text_el(left, base, label, size, fill=font.get("color") or "currentColor"))
    return out


def trace_el(t: dict, color: str, sx, sy, taken: list) -> str:
    """One scatter trace as a ``<g>``: a path for its lines, then markers, then text labels."""
    pts = [(num(a), num(b)) for a, b in zip(as_list(t.get("x")), as_list(t.get("y")), strict=False)]
    mode = t.get("mode") or ("lines+markers" if len(pts) < 20 else "lines")
    marker, line = t.get("marker") or {}, t.get("line") or {}
    mcolor = marker.get("color")
    lcolor = line.get("color") or (mcolor if isinstance(mcolor, str) else None) or color
    out = [f'<g data-trace="{esc(t.get("name") or "")}">']
    if "lines" in mode:
        d, pen = [], False  # a None (or NaN) breaks the line, as in plotly
        for x, y in pts:
            if x is None or y is None:
                pen = False
                continue
            d.append(f"{'L' if pen else 'M'}{fmt(sx(x))},{fmt(sy(y))}")
            pen = True
        if any(s.startswith("L") for s in d):
            stroke = stroke_attr(lcolor, line.get("width", 2), line.get("dash"))
            out.append(f'<path d="{"".join(d)}" fill="none" {stroke} stroke-linejoin="round"/>')
    if "markers" in mode and len(pts) > MAX_MARKERS:  # round dots: small and quick to draw
        dots = "".join(f"M{fmt(sx(x))},{fmt(sy(y))}h0" for x, y in pts if None not in (x, y))
        pen = stroke_attr(_at(mcolor, 0, color), float(_at(marker.get("size"), 0, 6)))
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


def legend_swatch(t: dict, color: str, x: float, y: float) -> str:
    mode = t.get("mode") or "lines+markers"
    marker, line = t.get("marker") or {}, t.get("line") or {}
    mcolor = marker.get("color")
    mcolor = mcolor if isinstance(mcolor, str) else color
    out = ""
    if "lines" in mode:
        stroke = stroke_attr(
            line.get("color") or mcolor, min(line.get("width", 2), 3), line.get("dash")
        )
        out += f'<path d="M{fmt(x)},{fmt(y)}h20" fill="none" {stroke}/>'
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


def legend_rows(
    entries: list[tuple[dict, str]], left: float, width: float
) -> tuple[list[list], int]:
    """Entries laid out in rows that fit ``width``: [[(trace, color, x offset), ...], ...]."""
    rows: list[list] = [[]]
    x = 0.0
    for t, color in entries:
        w = 26 + text_width(plain_text(t["name"]), 11) + 14
        if rows[-1] and x + w > width:
            rows.append([])
            x = 0.0
        rows[-1].append((t, color, left + x))
        x += w
    return rows, len(rows) if rows[0] else 0
