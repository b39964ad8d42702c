"""The explorer widget driven in Python: pick a hot path, change tabs, pick a node, and check
what it shows; its static copy; ``%gt explore`` through IPython's testing shell."""

from __future__ import annotations

import pytest
import torch

import gt_core
from gt_jupyter._bundles import PLOTLY_MIME, nbytes
from gt_jupyter._explore import TABS, Explorer, _data, explore

LIMIT = 500_000  # bytes an explorer may put on the page


def _loop(batch: int, steps: int = 12):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(batch, 8), torch.randn(batch, 4)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)  # THE LOSS
        loss.backward()
        opt.step()
        opt.zero_grad()
    return loss.item()


@pytest.fixture
def data(inprocess):
    """Two hot paths of one loop (batch 5, then batch 7): their report data."""
    gt_core.configure(auto_compile=True, threshold=3)
    with gt_core.capture():
        _loop(5)
        _loop(7)
    gt_core.wait(compiles=True)  # (the explorer's Code tab shows a compiled path's code)
    d = gt_core.report().to_data()
    assert len(d["hot_paths"]) == 2
    return d


def _figure(out) -> dict:
    (o,) = out.outputs
    return o["data"][PLOTLY_MIME]


def _labels(fig: dict) -> list[str]:
    return [t for tr in fig["data"] for t in (tr.get("text") or [])]


def test_the_graph_shows_groups_collapsed_until_opened(data):
    ex = explore(data=data)
    assert ex.selector.value == data["hot_paths"][-1]["signature"]
    labels = _labels(_figure(ex.figure))
    assert any(x.startswith("forward · 0 (") for x in labels)  # nn.Sequential's child "0"
    assert any(x.startswith("backward · ") for x in labels)
    assert any(x.startswith("optimizer · SGD (") for x in labels)  # its optimizer's class
    assert not any("addmm" in x for x in labels)  # inside its module's group
    closed = len(ex.graph_data["nodes"])
    ex.groups.value = (*ex.groups.value, "forward · 0")
    assert len(ex.graph_data["nodes"]) > closed
    assert "addmm" in _labels(_figure(ex.figure))
    ex.groups.value = ()  # all closed: one node per phase
    assert {x.split(" (")[0] for x in _labels(_figure(ex.figure)) if " ops)" in x} == {
        "forward",
        "backward",
        "optimizer",
    }


def test_the_explorer_opens_on_a_hot_path_whose_lines_are_known(data):
    """A block whose first matched occurrence has not come yet has no lines, modules or
    phases: the explorer opens on the latest hot path that has them."""
    last, first = data["hot_paths"][-1], data["hot_paths"][0]
    for e in last["canonical"]["entries"]:
        e["source"] = e["module"] = e["phase"] = None
    assert explore(data=data).selector.value == first["signature"]
    for e in first["canonical"]["entries"]:
        e["source"] = None
    assert explore(data=data).selector.value == last["signature"]  # none has: the latest


def test_the_selector_switches_the_graph(data):
    a, b = (p["signature"] for p in data["hot_paths"])
    ex = Explorer(data, a)
    first = _figure(ex.figure)["layout"]["title"]["text"]
    ex.selector.value = b
    assert a in first and b in _figure(ex.figure)["layout"]["title"]["text"]


def test_a_node_shows_its_op_shapes_and_source_line(data):
    ex = explore(data=data)
    ex.groups.value = tuple(g for _, g in ex.groups.options)  # everything open
    node = next(v for lb, v in ex.node.options if "addmm" in lb)
    ex.node.value = node
    shown = ex.detail.value
    assert "aten.addmm.default" in shown and "float32" in shown
    assert "test_explore.py:" in shown and "# THE LOSS" in shown
    d = _data.node_detail(ex.path["canonical"], ex._values(ex.path), node)
    assert d["module"] in ("0", "2") and d["phase"] == "forward"
    assert [i["shape"] for i in d["inputs"]][0] in ([16], [4])  # the bias


def test_source_code_compile_and_diff_tabs(data):
    a, b = (p["signature"] for p in data["hot_paths"])
    ex = Explorer(data, b)
    assert "# THE LOSS" in ex.source.value and "%" in ex.source.value  # its time share
    assert "return loss.item()" in ex.source.value  # a sync's line, outside the hot path
    ex.code_kind.value = "FX"
    assert "def forward" in ex.code.value
    ex.code_kind.value = "generated"
    assert "no generated code" in ex.code.value  # the eager backend
    assert "lowering" in ex.compile.value
    ex.other.value = a
    assert "shape [7, 8] → [5, 8]" in ex.diff_words.value or "shape" in ex.diff_words.value
    assert ex.diff_a.outputs == ()  # a figure is on the page only while its tab shows
    ex.tabs.selected_index = TABS.index("Diff")
    assert ex.figure.outputs == () and _figure(ex.diff_a) and _figure(ex.diff_b)
    assert any(x.startswith("≠") for x in _labels(_figure(ex.diff_a)))


def test_the_static_copy_is_the_current_view_and_small(data):
    ex = explore(data=data)
    b = ex.static_bundle()
    assert "application/vnd.jupyter.widget-view+json" in b  # a hidden one, where widgets run
    assert '<img src="data:image/svg+xml;base64,' in b["text/html"]
    ex.tabs.selected_index = TABS.index("Source")
    assert "# THE LOSS" in ex.static_bundle()["text/html"]
    total = sum(nbytes(o["data"]) for o in ex.figure.outputs) + len(ex.static_html())
    assert total < LIMIT


def test_gt_explore_magic_returns_the_explorer(inprocess):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gt_jupyter")
    try:
        with pytest.raises(UsageError, match="nothing to explore"):
            shell.run_line_magic("gt", "explore")
        gt_core.configure(auto_compile=True, threshold=3)
        with gt_core.capture():
            _loop(5)
        gt_core.wait()
        ex = shell.run_line_magic("gt", "explore")
        assert isinstance(ex, Explorer) and ex.path is not None
    finally:
        shell.run_line_magic("unload_ext", "gt_jupyter")


def test_a_block_of_hundreds_of_ops_reads_as_groups_and_stays_small(inprocess):
    # (the whole step as one block, not one layer's ops: a period of 400 ops at least)
    gt_core.configure(auto_compile=True, threshold=3, min_seq=400, window=8000)
    with gt_core.capture():
        torch.manual_seed(0)
        layers = [m for _ in range(24) for m in (torch.nn.Linear(16, 16), torch.nn.ReLU())]
        model = torch.nn.Sequential(*layers)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(4, 16)
        for _ in range(12):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    gt_core.wait()
    ex = explore()
    p = ex.path
    assert p["n_ops"] > 400
    nodes = [n for n in ex.graph_data["nodes"] if n["kind"] == "op"]
    assert len(nodes) <= 30  # groups of phase and module until opened
    ex.tabs.selected_index = TABS.index("Graph")
    total = sum(nbytes(o["data"]) for o in ex.figure.outputs) + len(ex.static_html())
    print(f"\nexplorer of {p['n_ops']} ops: {len(nodes)} op nodes, {total} bytes on the page")
    assert total < LIMIT


def test_gt_jupyter_explore_is_the_function():
    import gt_jupyter

    assert gt_jupyter.explore is explore


def test_a_shown_explorer_updates_its_static_copy_once_per_change(data, monkeypatch):
    import IPython.display

    shown, updates = [], []
    monkeypatch.setattr(IPython.display, "display", lambda b, **kw: shown.append((b, kw)))
    monkeypatch.setattr(IPython.display, "update_display", lambda b, **kw: updates.append(b))
    a, b = (p["signature"] for p in data["hot_paths"])
    ex = Explorer(data, a)
    ex._ipython_display_()
    (widget, _), (bundle, kw) = shown  # the widget, then its static copy
    assert "text/html" not in widget  # (shown once, where widgets do not run)
    assert kw["display_id"] == ex.display_id and a in bundle["text/html"]
    ex.selector.value = b  # redraws graph, nodes, source, code, compile, diff: one update
    assert len(updates) == 1 and b in updates[0]["text/html"]
    ex.code_kind.value = "FX"  # not in the Graph tab's copy: nothing re-sent
    assert len(updates) == 1
    ex.tabs.selected_index = TABS.index("Code")
    assert len(updates) == 2 and "def forward" in updates[1]["text/html"]


def test_a_user_compile_shows_its_compiles_failed_guard_breaks_and_guards():
    from gt_core.observe import events as ev
    from gt_core.observe.report import summarize

    def step(x, n):
        return x * n

    compiled = torch.compile(step, backend="eager")
    compiled(torch.ones(3), 1)
    compiled(torch.ones(3), 2)  # n == 1 failed: a recompile
    where = "cell.py:7"
    events = [
        {"type": ev.USER_COMPILE, "t": 1.0, "function": "step", "compile_id": "0/0", "seconds": 0.1},
        {"type": ev.USER_COMPILE, "t": 2.0, "function": "step", "compile_id": "0/1", "seconds": 0.1},
        {"type": ev.USER_RECOMPILE, "t": 2.0, "function": "step", "compile_id": "0/1",
         "reason": "n == 1", "where": where, "source": "return x * n"},
        {"type": ev.USER_GRAPH_BREAK, "t": 2.0, "function": "step", "reason": "print()",
         "where": "cell.py:9", "stack": [
             {"where": "cell.py:12", "function": "<module>", "text": "compiled(x, 2)"},
             {"where": "cell.py:9", "function": "step", "text": "print(n)"}]},
    ]  # fmt: skip
    ex = Explorer(summarize(events), namespace={"step": compiled})
    assert ex.selector.value == "user:step" and ex.path is None
    shown = ex.compile.value
    assert "0/0, 0/1" in shown and "failed guard n == 1 at cell.py:7: return x * n" in shown
    assert "print() at cell.py:9" in shown
    assert shown.index("cell.py:12 in &lt;module&gt;: compiled(x, 2)") < shown.index(
        "cell.py:9 in step: print(n)"
    )  # the user's stack down to the break, outermost first
    assert "guards" in shown and "entry" in shown  # each cache entry's guards, from Dynamo
    assert "cell.py:9" in ex.source.value and "graph break" in ex.source.value
