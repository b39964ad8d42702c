"""The dashboard on the wire: display bundles updated in place, small, with static copies.

What reaches the browser is what a user waits for: each part of a dashboard is its own
display, an update re-sends only the parts that changed; while the cell runs a figure is an
SVG image, at the end it is plotly JSON (drawn by the notebook's plotly renderer, loaded
once per page) with the image beside it for untrusted notebooks. Byte counts are deterministic, so they are asserted here;
the browser tests measure the same on a real page.
"""

import base64
import re
import xml.etree.ElementTree as ET

import IPython.display
import pytest

from gt_core import events as ev
from gt_core.observe.report import summarize
from gt_jupyter import dashboard as dashboard_module
from gt_jupyter._bundles import PLOTLY_MIME, nbytes
from gt_jupyter.dashboard import GRAPH_FILTERS, PARTS, Dashboard

CANONICAL = {
    "signature": "abc",
    "inputs": [{"name": "in0", "shape": [8, 16], "stride": [16, 1], "dtype": "float32", "device": "cpu"}],
    "entries": [
        {"kind": "op", "op": "aten.t.default", "args": ["%in0"], "kwargs": {}, "outs": ["t0"]},
        {"kind": "op", "op": "aten.mm.default", "args": ["%in0", "%t0"], "kwargs": {}, "outs": ["t1"]},
        {"kind": "op", "op": "aten.view.default", "args": ["%t1", [64]], "kwargs": {}, "outs": ["t2"]},
        {"kind": "op", "op": "aten.relu.default", "args": ["%t2"], "kwargs": {}, "outs": ["t3"]},
    ],
    "outputs": ["t3"],
}  # fmt: skip


def events(n_eager=4, n_compiled=6, signature="abc", t0=0.0, spike_every=0):
    """A hot path's events: eager runs, a detection, a compile, compiled runs."""
    t = t0
    out = [ev.event(ev.STATS, ops=500)]
    canonical = {**CANONICAL, "signature": signature}
    for i in range(n_eager):
        t += 0.01
        out.append(
            {"type": ev.ITERATION, "t": t, "signature": signature, "kind": "eager", "ms": 10.0}
        )
        if i == 1:
            out.append(
                {"type": ev.DETECTED, "t": t, "signature": signature, "n_ops": 4,
                 "ops": [e["op"] for e in canonical["entries"]], "occurrences": 2,
                 "canonical": canonical, "values": {}}
            )  # fmt: skip
            out.append({"type": ev.COMPILE_STARTED, "t": t, "signature": signature})
    out.append(
        {"type": ev.COMPILE_FINISHED, "t": t + 0.005, "signature": signature, "seconds": 0.005}
    )
    for i in range(n_compiled):
        t += 0.01
        ms = 500.0 if spike_every and i % spike_every == 0 else 5.0 + (i % 7) * 0.01
        out.append(
            {"type": ev.ITERATION, "t": t, "signature": signature, "kind": "compiled", "ms": ms}
        )
    return out


@pytest.fixture
def frontend(monkeypatch):
    """What the kernel would send: (kind, display id, bundle) per message."""
    sent = []
    monkeypatch.setattr(
        IPython.display,
        "display",
        lambda b, raw, display_id: sent.append(("display", display_id, b)),
    )
    monkeypatch.setattr(
        IPython.display,
        "update_display",
        lambda b, raw, display_id: sent.append(("update", display_id, b)),
    )
    monkeypatch.setattr(dashboard_module, "UPDATE_EVERY_S", 0.0)
    return sent


def svg_of(html: str) -> ET.Element:
    (uri,) = re.findall(r'<img src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', html)
    return ET.fromstring(base64.b64decode(uri).decode())


def test_each_part_is_its_own_display_and_updates_only_when_it_changed(frontend):
    dash = Dashboard(summarize([]), mode="notebook")
    dash.display("gt-cell")
    assert [(k, i) for k, i, _ in frontend] == [("display", f"gt-cell-{p}") for p in PARTS]
    frontend.clear()
    data = summarize(events())
    dash.update(data)
    changed = {i for _, i, _ in frontend}
    assert {"gt-cell-headline", "gt-cell-timeline", "gt-cell-graph"} <= changed
    assert "gt-cell-compiles" not in changed  # nothing new there: not re-sent
    live = {i: b for _, i, b in frontend}
    assert PLOTLY_MIME not in live["gt-cell-timeline"]  # an image while live (see _bundles)
    assert svg_of(live["gt-cell-timeline"]["text/html"]).find(".//{*}title") is None
    frontend.clear()
    dash.update(data)
    assert frontend == []  # the same data sends nothing
    dash.finalize(data)
    final = {i: b for _, i, b in frontend}
    # the final update: interactive plotly, and the static copy beside it (with hover titles)
    assert PLOTLY_MIME in final["gt-cell-timeline"] and PLOTLY_MIME in final["gt-cell-graph"]
    root = svg_of(final["gt-cell-timeline"]["text/html"])
    assert root.find(".//{*}title") is not None
    assert root.tag.endswith("svg") and "timeline abc" in root.get("aria-label", "")
    assert "<svg" not in final["gt-cell-timeline"]["text/html"]


def test_a_long_run_stays_small_on_the_wire(frontend):
    dash = Dashboard(summarize([]), mode="notebook")
    dash.display("gt-cell")
    opened = sum(nbytes(b) for _, _, b in frontend)
    frontend.clear()
    first = events(n_compiled=1000)
    dash.update(summarize(first))
    dash.update(summarize(first + events(n_eager=0, n_compiled=1000, t0=100.0)[2:]))
    updates = [nbytes(b) for _, _, b in frontend]
    dash.finalize()
    final = sum(nbytes(b) for _, _, b in frontend[len(updates) :])
    print(f"bytes: open {opened}, updates max {max(updates)}, final {final}")
    assert opened < 500_000 and max(updates) < 50_000 and final < 500_000
    timeline = dash.bundles()["timeline"][PLOTLY_MIME]
    assert max(len(tr["x"]) for tr in timeline["data"]) <= 400 + 1  # thinned


def test_a_figure_shown_again_after_the_end_gets_a_fresh_plotly_output(frontend):
    data = summarize(events() + events(signature="def", t0=10.0)[1:])
    dash = Dashboard(summarize([]), mode="notebook")
    dash.display("gt-cell")
    dash.finalize(data)
    frontend.clear()
    dash.select("abc")
    timeline = [b for _, i, b in frontend if i == "gt-cell-timeline"]
    # plotly's renderer ignores a second figure: an image replaces it, then the new plotly
    assert [PLOTLY_MIME in b for b in timeline] == [False, True]


def test_outliers_do_not_set_the_axis_and_stay_visible():
    dash = Dashboard(summarize(events(n_compiled=200, spike_every=50)), mode="notebook")
    fig = dash.bundles()["timeline"][PLOTLY_MIME]
    top = fig["layout"]["yaxis"]["range"][1]
    assert top < 100  # the 500 ms spikes would flatten the 5 ms points
    compiled = next(tr for tr in fig["data"] if tr["name"] == "compiled")
    clipped = [y for y, c in zip(compiled["y"], compiled["customdata"], strict=True) if c == 500.0]
    assert len(clipped) == 4 and all(y < top for y in clipped)  # drawn at the top, not dropped
    assert "triangle-up" in compiled["marker"]["symbol"]


def test_graph_modes_are_menu_buttons_that_show_different_traces():
    dash = Dashboard(summarize(events()), mode="notebook")
    fig = dash.bundles()["graph"][PLOTLY_MIME]
    (menu,) = fig["layout"]["updatemenus"]
    assert [b["label"] for b in menu["buttons"]] == list(GRAPH_FILTERS)
    masks = {b["label"]: b["args"][0]["visible"] for b in menu["buttons"]}

    def ops_shown(mask):
        return sum(
            len(tr["x"])
            for tr, v in zip(fig["data"], mask, strict=True)
            if v and tr["name"] == "ops"
        )

    assert ops_shown(masks["all ops"]) == 4 and ops_shown(masks["hide aliases"]) == 2
    assert [tr["visible"] for tr in fig["data"]] == masks["auto"]  # drawn as the first button


def test_several_hot_paths_get_a_selector_in_each_figure():
    data = summarize(events() + events(signature="def", t0=10.0)[1:])
    dash = Dashboard(data, mode="notebook")
    parts = dash.bundles()
    (menu,) = parts["timeline"][PLOTLY_MIME]["layout"]["updatemenus"]
    assert menu["type"] == "dropdown" and {b["label"] for b in menu["buttons"]} == {"abc", "def"}
    graph_labels = [
        b["label"] for b in parts["graph"][PLOTLY_MIME]["layout"]["updatemenus"][0]["buttons"]
    ]
    assert "abc · all ops" in graph_labels and "def · hide aliases" in graph_labels
    dash.select("abc")
    assert dash.bundles()["timeline"][PLOTLY_MIME]["layout"]["updatemenus"][0]["active"] == 0
    assert dash.signature == "abc"
