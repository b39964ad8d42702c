"""The static HTML fallback: figures as inline SVG that show with scripts stripped (GitHub)."""

import base64
import math
import re
import xml.etree.ElementTree as ET

import torch

import gt_core
from gt_core import events as ev
from gt_core.observe.graph import graph_data
from gt_core.observe.report import summarize
from gt_jupyter import _figures, _graphs, _render, _svg, _svg_marks, _tables
from gt_jupyter.dashboard import Dashboard
from gt_jupyter.views import GraphView

NS = {"s": "http://www.w3.org/2000/svg"}
CANONICAL = {
    "signature": "abc",
    "inputs": [{"name": "in0", "shape": [8, 16], "stride": [16, 1], "dtype": "float32", "device": "cpu"}],
    "entries": [
        {"kind": "op", "op": "aten.mm.default", "args": ["%in0", "%in0"], "kwargs": {}, "outs": ["t0"]},
        {"kind": "op", "op": "aten.relu.default", "args": ["%t0"], "kwargs": {}, "outs": ["t1"]},
        {"kind": "free", "value": "t1"},
    ],
    "outputs": ["t1"],
}  # fmt: skip
VALUES = {"t0": {"shape": [8, 8], "dtype": "float32"}, "t1": {"shape": [8, 8], "dtype": "float32"}}
GRAPH = graph_data(CANONICAL, VALUES)
USER = [
    {
        "function": "kv_step",
        "limit_hit": True,
        "timeline": [
            {"t": 10.0, "seconds": 0.5, "compile_id": "0/0", "recompile": False, "resume": False},
            {"t": 11.0, "seconds": 0.2, "compile_id": "0/1", "recompile": True, "resume": False},
        ],
    }
]


def _events(n_eager=4, n_compiled=6, compile=True):
    """Events shaped like the worker's: eager iterations, a detection, a compile, compiled ones."""
    out, t = [ev.event(ev.STATS, ops=500)], 0.0
    for i in range(n_eager):
        t += 1
        out.append({"type": ev.ITERATION, "t": t, "signature": "abc", "kind": "eager", "ms": 10.0})
        if i == 1:
            out.append({"type": ev.DETECTED, "t": t, "signature": "abc", "ops": ["aten.mm.default", "aten.relu.default"], "n_ops": 2, "occurrences": 2, "canonical": CANONICAL, "values": VALUES})  # fmt: skip
            if compile:
                out.append({"type": ev.COMPILE_STARTED, "t": t + 0.1, "signature": "abc"})
    if compile:
        out.append({"type": ev.COMPILE_FINISHED, "t": t + 0.5, "signature": "abc", "seconds": 0.02})
    for _ in range(n_compiled):
        t += 1
        out.append(
            {"type": ev.ITERATION, "t": t, "signature": "abc", "kind": "compiled", "ms": 5.0}
        )
    return out


def _svgs(html: str) -> list[ET.Element]:
    """Every figure of ``html``, an ``<img>`` of a data-URI SVG (what untrusted notebooks draw:
    inline ``<svg>`` is sanitized away there), parsed as XML (a parse error fails the test)."""
    assert "<svg" not in html  # never inline
    uris = re.findall(r'<img src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', html)
    return [ET.fromstring(base64.b64decode(u).decode()) for u in uris]


def _title(root: ET.Element) -> str:
    return root.get("aria-label", "")


def _trace(root: ET.Element, name: str) -> ET.Element:
    (g,) = root.findall(f".//s:g[@data-trace='{name}']", NS)
    return g


def _texts(root: ET.Element) -> str:
    return " ".join("".join(t.itertext()) for t in root.iter(f"{{{NS['s']}}}text"))


def _static(events, user=()) -> str:
    return Dashboard({**summarize(events), "user_compiles": list(user)}, mode="text").to_html()


def test_static_html_draws_every_figure_as_svg_without_scripts():
    html = _static(_events(), USER)
    assert "<script" not in html.lower()
    assert "cdn" not in html.lower() and "https://" not in html and "plotly" not in html.lower()
    timeline, graph, user = _svgs(html)
    assert _title(timeline).startswith("timeline abc")
    assert _title(graph).startswith("dependency graph abc")
    assert "compiles and recompiles" in _title(user)
    assert "<table>" in html  # the tables are still there
    for root in (timeline, graph, user):
        # Ink follows the page's text colour: reads on light and dark themes.
        assert root.get("fill") == "currentColor"
        assert not re.search(
            r'="(#000000|#000|black|#ffffff|#fff|white)"', ET.tostring(root, "unicode")
        )


def test_one_marker_per_iteration_and_axes_with_titles():
    (timeline, *_) = _svgs(_static(_events(4, 6)))
    assert len(_trace(timeline, "eager").findall("s:circle", NS)) == 4
    assert len(_trace(timeline, "compiled").findall("s:circle", NS)) == 6
    assert _trace(timeline, "eager (compiling)").findall("s:circle", NS) == []
    tips = [c.findtext("s:title", namespaces=NS) for c in _trace(timeline, "compiled")]
    assert tips[0] == "compiled\niteration 5\n5 ms"  # plotly's hover template, filled in
    text = _texts(timeline)
    for words in ("iteration", "ms per iteration", "total s", "eager", "total, with gt"):
        assert words in text
    assert re.search(r"\b10\b", text) and re.search(r"\b0\b", text)  # tick labels
    # The cumulative totals are lines on the right axis.
    (path,) = _trace(timeline, "total, with gt").findall("s:path", NS)
    assert path.get("d").count("L") == 9


def test_compile_window_break_even_and_speedup_are_marked():
    (timeline, *_) = _svgs(_static(_events()))
    td = _figures.timeline_data(summarize(_events())["events"], "abc")
    assert td["break_even"] is not None and td["window"] is not None
    rects = [r for r in timeline.iter(f"{{{NS['s']}}}rect") if r.get("fill") == "rgb(178,121,162)"]
    assert len(rects) == 1 and float(rects[0].get("fill-opacity")) < 0.5
    (line,) = [x for x in timeline.iter(f"{{{NS['s']}}}line") if x.get("stroke") == "#E45756"]
    assert line.get("stroke-dasharray")
    text = _texts(timeline)
    assert f"break-even at {td['break_even']}" in text
    assert "steady state 2.00x" in text and "compile 0.02 s" in text


def test_no_marks_where_the_data_has_none():
    (timeline, *_) = _svgs(_static(_events(6, 0, compile=False)))
    text = _texts(timeline)
    assert "break-even" not in text and "steady state" not in text and "compile" not in text
    assert not [r for r in timeline.iter(f"{{{NS['s']}}}rect")]


def test_graph_nodes_carry_op_shape_and_dtype_in_their_tooltips():
    _, graph = _svgs(_static(_events()))
    ops = _trace(graph, "ops").findall("s:circle", NS)
    assert len(ops) == 2
    tips = [c.findtext("s:title", namespaces=NS) for c in ops]
    assert any(
        "op: aten.mm.default" in t and "shape: [8, 8]" in t and "dtype: float32" in t for t in tips
    )
    assert any("aten.relu.default" in t and "freed inside the block" in t for t in tips)
    # Freed values are open circles; inputs and outputs have their own traces.
    assert sorted(c.get("fill") for c in ops) == ["#F58518", "none"]
    assert len(_trace(graph, "inputs").findall("s:circle", NS)) == 1
    assert len(_trace(graph, "outputs").findall("s:circle", NS)) == 1
    (edges,) = _trace(graph, "dependencies").findall("s:path", NS)
    assert edges.get("d").count("M") == 3  # one segment per edge
    assert {"mm", "relu", "in0", "t1"} <= set(_texts(graph).split())


def test_the_graph_is_built_client_side_from_the_canonical_form_and_value_metadata():
    expected = {
        "nodes": [
            {"id": "in0", "kind": "input", "label": "in0", "op": None, "shape": [8, 16], "dtype": "float32", "freed": False},
            {"id": "op0", "kind": "op", "label": "mm", "op": "aten.mm.default", "shape": [8, 8], "dtype": "float32", "output": False, "freed": False},
            {"id": "op1", "kind": "op", "label": "relu", "op": "aten.relu.default", "shape": [8, 8], "dtype": "float32", "output": True, "freed": True},
            {"id": "out:t1", "kind": "output", "label": "t1", "op": None, "shape": [8, 8], "dtype": "float32", "freed": False},
        ],
        "edges": [["in0", "op0"], ["op0", "op1"], ["op1", "out:t1"]],
    }  # fmt: skip
    assert GRAPH == expected
    events = summarize(_events())["events"]
    assert _graphs.graph_of(events, "abc") == expected
    assert _graphs.graph_of(events, "abc") is _graphs.graph_of(events, "abc")  # built once
    assert _graphs.graph_of(events, "other") is None


def test_graph_view_saves_svg_and_keeps_plotly_for_live_frontends():
    bundle = GraphView("abc", GRAPH)._repr_mimebundle_()
    assert "<script" not in bundle["text/html"] and len(_svgs(bundle["text/html"])) == 1
    assert "application/vnd.plotly.v1+json" in bundle


def test_gaps_single_points_empty_traces_and_no_data():
    nan = float("nan")
    fig = {
        "data": [
            {"type": "scatter", "name": "gappy", "mode": "lines+markers", "x": [1, 2, 3, 4, 5], "y": [1.0, None, 3.0, nan, 5.0]},
            {"type": "scatter", "name": "one", "mode": "markers", "x": [2], "y": [7.0]},
            {"type": "scatter", "name": "empty", "mode": "markers", "x": [], "y": []},
        ],
        "layout": {"title": {"text": "edge cases"}, "xaxis": {"title": {"text": "x"}}},
    }  # fmt: skip
    root = ET.fromstring(_svg.svg(fig))
    assert len(_trace(root, "gappy").findall("s:circle", NS)) == 3  # None and NaN are skipped
    assert _trace(root, "gappy").findall("s:path", NS) == []  # no two neighbours to join
    assert len(_trace(root, "one").findall("s:circle", NS)) == 1
    legend = _texts(root)
    assert "gappy" in legend and "one" in legend and "empty" not in legend
    single = ET.fromstring(_svg.svg({"data": [{"type": "scatter", "x": [3], "y": [3]}]}))
    (c,) = single.iter(f"{{{NS['s']}}}circle")
    assert all(math.isfinite(float(c.get(k))) for k in ("cx", "cy"))
    empty = ET.fromstring(_svg.svg({"data": [], "layout": {"title": "nothing yet"}}))
    assert "no data" in _texts(empty) and _title(empty) == "nothing yet"
    # A timeline with no iterations yet still draws (the live dashboard starts that way).
    (timeline,) = _svgs(_render.figure_html(_figures.timeline(_figures.timeline_data([], "abc"))))
    assert "no iterations yet" in _title(timeline)


def test_nice_ticks():
    assert _svg_marks.nice_ticks(0, 10, 5) == [0, 2, 4, 6, 8, 10]
    assert _svg_marks.nice_ticks(0.0, 0.13, 5) == [0.0, 0.05, 0.1]
    assert _svg_marks.nice_ticks(3, 3) == [3]


def test_static_dashboard_of_a_real_capture(inprocess):
    gt_core.configure(auto_compile=True, backend="eager", background=False, threshold=3, regression_samples=10_000)  # fmt: skip
    torch.manual_seed(0)
    with gt_core.capture():
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        for _ in range(10):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        loss.item()
    data = gt_core.report().to_data()
    sig = _tables.primary(data)
    html = Dashboard(data, mode="text").to_html()
    assert "<script" not in html.lower() and "cdn" not in html.lower()
    timeline, graph = _svgs(html)
    td = _figures.timeline_data(data["events"], sig)
    for kind, name in (("eager", "eager"), ("compiled", "compiled")):
        circles = _trace(timeline, name).findall("s:circle", NS)
        assert len(circles) == td["kinds"].count(kind)
    assert td["kinds"].count("compiled") >= 1
    nodes = _graphs.graph_of(data["events"], sig)["nodes"]
    ops = _trace(graph, "ops").findall("s:circle", NS)
    assert len(ops) == sum(n["kind"] == "op" for n in nodes)
    tips = " ".join(c.findtext("s:title", namespaces=NS) for c in ops)
    assert "op: aten.addmm.default" in tips and "dtype: float32" in tips
