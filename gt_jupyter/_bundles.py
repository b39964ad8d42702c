"""Figures as display bundles: plotly's JSON for a live notebook, a static image for the rest.

A figure goes to the frontend as a MIME bundle, never as a widget: JupyterLab draws
``application/vnd.plotly.v1+json`` with the plotly renderer it loads once per page (over
HTTP, cached), and the bundle survives a page reload and a saved notebook. An untrusted
notebook (one reopened from disk, GitHub, nbviewer) does not run that renderer and strips
inline ``<svg>``; it does draw an ``<img>`` whose source is a data-URI SVG, so that is the
static copy in ``text/html``.

Interactions that must work without a kernel (the hot-path choice, graph modes) are plotly
``updatemenus``: one figure holds each variant's traces and a button shows one of them.
"""

from __future__ import annotations

import base64
import json
import math
import re

from . import _svg

__all__ = [
    "PLOTLY_MIME",
    "bundle",
    "compact",
    "img_html",
    "live_bundle",
    "merge_variants",
    "nbytes",
]

PLOTLY_MIME = "application/vnd.plotly.v1+json"
CONFIG = {"responsive": True, "displaylogo": False}
DIGITS = 4  # significant digits kept in figure numbers (what a hover shows)


def compact(obj):
    """``obj`` with floats rounded to DIGITS significant digits (smaller messages, same plot)."""
    if isinstance(obj, float):
        if obj == 0.0 or not math.isfinite(obj):
            return obj if math.isfinite(obj) else None
        return round(obj, DIGITS - 1 - math.floor(math.log10(abs(obj))))
    if isinstance(obj, dict):
        return {k: compact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [compact(v) for v in obj]
    return obj


def as_dict(fig) -> dict:
    """A plotly figure (graph_objects or already a dict) as its plain, rounded JSON dict."""
    d = fig if isinstance(fig, dict) else fig.to_plotly_json()
    return compact({"data": list(d.get("data", [])), "layout": dict(d.get("layout", {}))})


def img_html(fig: dict, alt: str, tips: bool = True) -> str:
    """The static copy: an ``<img>`` of the figure's SVG as a data URI (drawn untrusted).

    ``tips``: keep each mark's ``<title>`` (a viewer that opens the SVG itself shows them);
    without them the image is about half the bytes.
    """
    svg = _svg.svg(fig)
    if not tips:
        svg = re.sub(r"<title>.*?</title>", "", svg, flags=re.DOTALL)
    uri = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode("ascii")
    alt = alt.replace('"', "'").replace("<", "‹").replace(">", "›")
    return f"<div class='gt-fig'><img src=\"{uri}\" alt=\"{alt}\" style='max-width:100%'></div>"


def bundle(fig, text: str) -> dict:
    """The display bundle of one figure: plotly JSON (interactive), text, the image copy."""
    d = as_dict(fig)
    return {
        "text/plain": text,
        PLOTLY_MIME: {**d, "config": CONFIG},
        "text/html": img_html(d, text),
    }


def live_bundle(fig, text: str) -> dict:
    """A figure while its cell runs: the image alone, redrawn at each update.

    JupyterLab keeps an output's renderer when an update has the same preferred MIME type,
    and plotly's renderer ignores a second figure once it has drawn one: plotly JSON sent
    as an update would never show. An image re-renders; the final update (``bundle``)
    switches the output to plotly, which then gets a renderer of its own.
    """
    d = as_dict(fig)
    return {"text/plain": text, "text/html": img_html(d, text, tips=False)}


def nbytes(bundle: dict) -> int:
    """Bytes this bundle takes in a message (its JSON)."""
    return len(json.dumps(bundle, separators=(",", ":")))


def merge_variants(
    variants: list[tuple[str, dict]], shown: int, *, dropdown: bool, x: float = 1.0
) -> dict:
    """One figure holding every variant's traces, with a menu that shows one variant at a time.

    ``variants``: (button label, figure dict) pairs; ``shown``: the index drawn at first. Each
    button sets which traces are visible and the variant's title, shapes and annotations.
    Variants with identical traces share them (their buttons differ only in layout).
    """
    shown_fig = variants[shown][1]
    data: list[dict] = []
    slots: list[list[int]] = []
    seen: dict[str, list[int]] = {}
    for _, fig in variants:
        key = json.dumps(fig["data"], sort_keys=True)
        if key not in seen:
            seen[key] = list(range(len(data), len(data) + len(fig["data"])))
            data += [dict(tr) for tr in fig["data"]]
        slots.append(seen[key])
    for i, tr in enumerate(data):
        tr["visible"] = i in slots[shown]
    buttons = []
    for (label, fig), slot in zip(variants, slots, strict=True):
        lay = fig["layout"]
        buttons.append(
            {
                "label": label,
                "method": "update",
                "args": [
                    {"visible": [i in slot for i in range(len(data))]},
                    {
                        "title": lay.get("title", {}),
                        "shapes": lay.get("shapes", []),
                        "annotations": lay.get("annotations", []),
                    },
                ],
            }
        )
    layout = dict(shown_fig["layout"])
    menu = {
        "type": "dropdown" if dropdown else "buttons",
        "direction": "down" if dropdown else "left",
        "buttons": buttons,
        "active": shown,
        "showactive": True,
        "x": x,
        "xanchor": "right",
        "y": 1.0,
        "yanchor": "bottom",
        "pad": {"t": 2, "b": 2},
        "font": {"size": 11},
    }
    layout["updatemenus"] = [*layout.get("updatemenus", []), menu]
    layout["margin"] = {**layout.get("margin", {}), "t": 70}
    return {"data": data, "layout": layout}
