"""The Jupyter layer through IPython's own testing shell: %load_ext, %%gt, %gt, the dashboard."""

import contextlib
import json
import subprocess
import sys

import pytest
import torch
from conftest import moved
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython

import gt_core
from gt_core.observe.report import summarize
from gt_jupyter import _figures, _graphs, _render, _tables
from gt_jupyter.dashboard import Dashboard
from gt_jupyter.magics import GT

TRAIN = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x, y = torch.randn(8, 16), torch.randn(8, 4)
for _ in range(STEPS):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
"""


def eager_loss(steps: int) -> float:
    ns: dict = {}
    exec(TRAIN.replace("STEPS", str(steps)), ns)
    return ns["loss"].item()


@pytest.fixture
def ip(inprocess):
    shell = start_ipython() or InteractiveShell.instance()  # IPython's testing shell, made once
    shell.run_line_magic("load_ext", "gt_jupyter")
    gt_core.configure(
        auto_compile=True, backend="eager", threshold=3, regression_samples=10_000, background=False
    )
    yield shell
    shell.run_line_magic("unload_ext", "gt_jupyter")
    shell.config.pop("GT", None)  # a test's %config GT.x stays in the shell's config otherwise
    gt_core.configure(regression_samples=5, background=True)


def run(ip, cell: str):
    """Run a cell as a user does; returns the ExecutionResult (errors are shown, not raised)."""
    return ip.run_cell(cell, store_history=False)


def test_gt_cell_trains_on_the_worker_and_compiles_the_step(ip, capsys):
    r = run(ip, "%%gt --threshold 3\n" + TRAIN.replace("STEPS", "12"))
    assert r.success, r.error_in_exec
    ns = ip.user_ns
    assert gt_core.is_remote(ns["loss"])  # names of the cell live on
    assert ns["loss"].item() == pytest.approx(eager_loss(12), abs=1e-6)
    dash = ip.magics_manager.registry["GTMagics"].dashboard
    assert dash.final
    paths = dash.data["hot_paths"]
    assert paths and paths[0]["status"] == "compiled"
    assert paths[0]["compiled_runs"] >= 1
    assert dash.data["stats"]["ops"] > 100
    # The terminal shows the plain-text summary once, at the end.
    out = capsys.readouterr().out
    assert out.count("gt: ") == 1 and "compiled" in out


def test_proxies_keep_working_in_later_cells(ip):
    assert run(ip, "%%gt\nimport torch\na = torch.ones(3)").success
    r = run(ip, "b = (a * 2).sum().item()")
    assert r.success and ip.user_ns["b"] == 6.0


def test_cell_value_is_the_last_expression(ip):
    r = run(ip, "%%gt\nimport torch\nt = torch.arange(4.)\nt.sum().item()")
    assert r.result == 6.0


@pytest.mark.parametrize(
    "line, words",
    [
        ("--threshold", "expected one argument"),
        ("--bogus", "unrecognized arguments"),
        ("--show loud", "invalid choice"),
        ("--threshold 1", "threshold=1 is not accepted; expected an integer >= 2"),
        ("--mode fastest", "mode"),
        ("--backend nope", "backend='nope' is not accepted"),  # gt_core.ConfigError
        ("--local --threshold 1", "threshold=1"),
        ("--log /nonexistent-gt-dir/events.jsonl", "expected a writable file path"),
    ],
)
def test_bad_option_is_a_one_line_usage_error_and_the_cell_does_not_run(ip, line, words):
    ip.user_ns.pop("ran", None)
    with pytest.raises(UsageError) as err:
        ip.run_cell_magic("gt", line, "ran = True")
    msg = str(err.value)
    assert words in msg and "\n" not in msg
    assert msg.startswith("%%gt: ")
    assert "usage: %%gt [--no-compile] [--compile] [--threshold N]" in msg  # the cell magic's
    assert ":: " not in msg and " %gt " not in msg
    assert "ran" not in ip.user_ns


def test_config_error_on_entering_the_capture_is_a_usage_error(ip, monkeypatch):
    @contextlib.contextmanager
    def refuse(**options):  # as capture() does when the log path cannot be opened
        raise gt_core.ConfigError("log (GT_INSTRUCTION_LOG)", "x", "a writable file path")
        yield

    monkeypatch.setattr(gt_core, "capture", refuse)
    ip.user_ns.pop("ran", None)
    with pytest.raises(UsageError, match=r"log \(GT_INSTRUCTION_LOG\)='x' .* usage: %%gt "):
        ip.run_cell_magic("gt", "", "ran = True")
    assert "ran" not in ip.user_ns


def test_exception_inside_the_cell_leaves_the_session_usable(ip, capsys):
    r = run(ip, "%%gt\nimport torch\nz = torch.ones(2, 3) @ torch.ones(4, 5)\nz.sum().item()")
    assert not r.success and isinstance(r.error_in_exec, RuntimeError)
    assert "2" in str(r.error_in_exec) and "5" in str(r.error_in_exec)  # the shapes are named
    r = run(ip, "%%gt\nimport torch\nok = (torch.ones(2) + 1).sum().item()")
    assert r.success and ip.user_ns["ok"] == 4.0


def test_dashboard_is_replaced_not_appended_on_rerun(ip, monkeypatch):
    shown = []
    monkeypatch.setattr(Dashboard, "live", property(lambda self: True))
    monkeypatch.setattr(
        "IPython.display.display",
        lambda obj, display_id=None, **kw: shown.append(display_id) or _Handle(),
    )
    cell = "%%gt --show status\nimport torch\nq = torch.ones(2).sum().item()"
    run(ip, cell)
    first = list(shown)
    run(ip, cell)
    assert shown[len(first) :] == first  # the same display ids: the frontend replaces them
    run(ip, cell + "  # changed")
    assert not set(shown[2 * len(first) :]) & set(first)  # a different cell gets its own


class _Handle:
    def update(self, obj):
        pass


def test_gt_status_config_reset_restart_stop(ip):
    run(ip, "%%gt\n" + TRAIN.replace("STEPS", "8"))
    status = ip.run_line_magic("gt", "status")
    text = repr(status)
    assert f"pid {gt_core.worker().pid}" in text and "hot paths: 1" in text
    assert "<table>" in status._repr_html_()

    cfg = ip.run_line_magic("gt", "config threshold=4 backend=aot_eager debug=0")
    assert "threshold = 4" in repr(cfg) and gt_core.config()["threshold"] == 4
    with pytest.raises(UsageError, match="threshold"):
        ip.run_line_magic("gt", "config threshold=one")
    with pytest.raises(UsageError, match="key=value"):
        ip.run_line_magic("gt", "config threshold")
    # %config reaches the same options.
    ip.run_line_magic("config", "GT.min_seq = 9")
    assert gt_core.config()["min_seq"] == 9
    ip.run_line_magic("gt", "config min_seq=8")

    ip.run_line_magic("gt", "reset")
    assert gt_core.report().to_data()["hot_paths"] == []
    old = gt_core.worker().pid
    ip.run_line_magic("gt", "restart")
    assert gt_core.worker().alive
    ip.run_line_magic("gt", "stop")
    assert not gt_core.worker().started
    assert "not started" in repr(ip.run_line_magic("gt", "status"))
    del old
    with pytest.raises(UsageError, match="unknown command"):
        ip.run_line_magic("gt", "fly")


def test_gt_status_counts_fallbacks(ip):
    from gt_core import events as ev

    run(ip, "%%gt\n" + TRAIN.replace("STEPS", "8"))
    text = repr(ip.run_line_magic("gt", "status"))
    assert "failed 0, reverted 0, fallbacks 0;" in text
    (sig,) = [p["signature"] for p in gt_core.report().to_data()["hot_paths"]]
    # (a compiled run that raised, as the worker says it: the move, then why)
    gt_core.events_log().emit(ev.STATE, signature=sig, status="failed", was="compiled")
    gt_core.events_log().emit(ev.FALLBACK, signature=sig, reason="RuntimeError: boom")
    status = ip.run_line_magic("gt", "status")
    assert "failed 1, reverted 0, fallbacks 1;" in repr(status)
    assert "fallbacks 1" in status._repr_html_()


def test_gt_explain_a_compiled_function(ip):
    ip.run_cell("import torch\nf = torch.compile(lambda x: x.sin() + 1, backend='eager')")
    ip.run_cell("f(torch.randn(3))")
    assert "1 cache entry" in repr(ip.run_line_magic("gt", "explain f"))


@pytest.mark.parametrize(
    "line, came",
    [
        ("explain t", "got 't', a Tensor"),
        ("explain 3", "got '3', a int"),
        ("explain undefined_thing", "got 'undefined_thing', which does not evaluate here "),
        ("explain len", "got 'len', a builtin_function_or_method"),
    ],
)
def test_gt_explain_of_something_not_compiled_is_a_usage_error(ip, line, came):
    ip.user_ns["t"] = torch.ones(2)
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("gt", line)
    msg = str(err.value)
    assert msg.startswith("%gt explain: expected a function or module passed to torch.compile")
    assert came in msg and "torch.compile(fn)" in msg and "\n" not in msg


def test_gt_explain_wants_one_function(ip):
    with pytest.raises(UsageError, match="got 0 arguments; usage: %gt explain FUNCTION"):
        ip.run_line_magic("gt", "explain")


def test_gt_graph_and_diff_after_a_batch_size_change(ip):
    assert run(ip, "%%gt\n" + TRAIN.replace("STEPS", "8")).success
    assert run(
        ip,
        "%%gt\nx, y = torch.randn(4, 16), torch.randn(4, 4)\n"
        + TRAIN.split("x, y")[1].split("\n", 1)[1].replace("STEPS", "8"),
    ).success
    sigs = [p["signature"] for p in gt_core.report().to_data()["hot_paths"]]
    assert len(sigs) == 2
    g = ip.run_line_magic("gt", f"graph {sigs[0][:6]}")
    assert "dependency graph" in repr(g) and "addmm" in repr(g)
    bundle = g._repr_mimebundle_()
    assert "text/html" in bundle and "application/vnd.plotly.v1+json" in bundle
    d = repr(ip.run_line_magic("gt", f"diff {sigs[0]} {sigs[1]}"))
    assert "[8, 16]" in d and "[4, 16]" in d
    with pytest.raises(UsageError, match="no hot path signature matches"):
        ip.run_line_magic("gt", "graph zzzz")


def test_gt_log_shows_a_saved_instruction_log_offline(ip, tmp_path):
    log = tmp_path / "events.jsonl"
    assert run(ip, f"%%gt --log {log}\n" + TRAIN.replace("STEPS", "8")).success
    gt_core.configure(log=None)
    dash = ip.run_line_magic("gt", f"log {log}")
    assert isinstance(dash, Dashboard) and dash.data["hot_paths"][0]["status"] == "compiled"
    with pytest.raises(UsageError, match="cannot read"):
        ip.run_line_magic("gt", f"log {tmp_path / 'missing.jsonl'}")


def test_gt_dashboard_shows_the_last_cells_again(ip):
    with pytest.raises(UsageError):
        ip.magics_manager.registry["GTMagics"].dashboard = None
        ip.run_line_magic("gt", "dashboard")
    run(ip, "%%gt\n" + TRAIN.replace("STEPS", "8"))
    assert ip.run_line_magic("gt", "dashboard") is ip.magics_manager.registry["GTMagics"].dashboard


def test_load_twice_is_harmless_and_unload_stops_the_worker(ip):
    ip.run_line_magic("load_ext", "gt_jupyter")
    ip.run_line_magic("reload_ext", "gt_jupyter")
    run(ip, "%%gt\nimport torch\nv = torch.ones(1)")
    assert gt_core.worker().started
    ip.run_line_magic("unload_ext", "gt_jupyter")
    assert not gt_core.worker().started
    assert "gt" not in ip.magics_manager.magics["cell"]
    ip.run_line_magic("load_ext", "gt_jupyter")


def test_config_traits_mirror_the_options():
    opts = gt_core.Options()
    for trait, option in GT.option_traits().items():
        assert getattr(GT(), trait) == getattr(opts, option), trait


# -- dashboard data ------------------------------------------------------------------------
def _events(n_eager=4, n_compiled=6):
    from gt_core import events as ev

    t = 0.0
    out = [ev.event(ev.STATS, ops=500)]
    canonical = {
        "signature": "abc",
        "inputs": [
            {"name": "in0", "shape": [8, 16], "stride": [16, 1], "dtype": "float32", "device": "cpu"}
        ],
        "entries": [
            {"kind": "op", "op": "aten.mm.default", "args": ["%in0", "%in0"], "kwargs": {}, "outs": ["t0"]},
            {"kind": "op", "op": "aten.relu.default", "args": ["%t0"], "kwargs": {}, "outs": ["t1"]},
        ],
        "outputs": ["t1"],
    }  # fmt: skip
    values = {
        "t0": {"shape": [8, 8], "dtype": "float32"},
        "t1": {"shape": [8, 8], "dtype": "float32"},
    }
    for i in range(n_eager):
        t += 1
        out.append({"type": ev.ITERATION, "t": t, "signature": "abc", "kind": "eager", "ms": 10.0})
        if i == 1:
            out.append(
                {
                    "type": ev.DETECTED,
                    "t": t,
                    "signature": "abc",
                    "ops": ["aten.mm.default", "aten.relu.default"],
                    "n_ops": 2,
                    "occurrences": 2,
                    "canonical": canonical,
                    "values": values,
                }
            )
            out.append(moved("abc", "compiling", t + 0.1))
            out.append({"type": ev.COMPILE_STARTED, "t": t + 0.1, "signature": "abc"})
    out.append(moved("abc", "compiled", t + 0.5, was="compiling"))
    out.append({"type": ev.COMPILE_FINISHED, "t": t + 0.5, "signature": "abc", "seconds": 0.02})
    for _ in range(n_compiled):
        t += 1
        out.append(
            {"type": ev.ITERATION, "t": t, "signature": "abc", "kind": "compiled", "ms": 5.0}
        )
    return out


def test_dashboard_data_traces_and_rows():
    data = summarize(_events())
    dash = Dashboard(data, mode="text")
    timeline, graph = dash.figures()
    names = [tr.name for tr in timeline.data]
    assert any("eager" in n for n in names) and any("compiled" in n for n in names)
    ys = [y for tr in timeline.data if tr.name and "compiled" in tr.name for y in (tr.y or ())]
    assert 5.0 in ys
    td = _figures.timeline_data(data["events"], "abc")
    assert td["speedup"] == pytest.approx(2.0) and td["break_even"] is not None
    assert td["window"] is not None
    assert {tr.name for tr in graph.data} >= {"inputs", "ops", "outputs"}
    rows = _tables.status_rows(data)
    assert (
        rows[0]["signature"] == "abc"
        and rows[0]["status"] == "compiled"
        and rows[0]["speedup"] == pytest.approx(2.0)
    )
    html = dash.to_html()
    assert "data:image/svg+xml;base64," in html and "<script" not in html and "<table>" in html
    assert "abc" in html
    assert "saved" in dash.to_text()


def test_cell_view_counts_only_the_cells_runs_but_keeps_the_status():
    events = _events()
    k = len(events) - 2
    data = summarize(events, since=k)
    p = data["hot_paths"][0]
    assert p["status"] == "compiled" and p["compiled_runs"] == 2 and p["eager_runs"] == 0
    assert _graphs.graph_of(data["events"], "abc") is not None  # detection came earlier
    assert data["stats"]["ops"] == 0
    assert summarize(events, since=len(events))["hot_paths"] == []


def test_the_display_layer_does_not_import_torch_nor_plotly_until_it_draws():
    code = (
        "import sys, gt_jupyter, gt_jupyter.dashboard, gt_jupyter.views, gt_jupyter._figures;"
        "print('torch' in sys.modules, 'plotly' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_observe_and_signal_do_not_import_torch_and_the_api_loads_on_first_use():
    code = (
        "import sys, gt_core, gt_core.observe, gt_core.signal\n"
        "import gt_core.observe.metrics, gt_core.observe.graph, gt_core.observe.status\n"
        "assert 'torch' not in sys.modules, 'torch imported at load'\n"
        "assert sorted(set(gt_core.__all__) - set(dir(gt_core))) == []\n"
        "from gt_core import capture\n"
        "import gt_core.options, gt_core.worker_process\n"
        "assert 'torch' in sys.modules\n"
        "assert callable(gt_core.worker) and callable(gt_core.config), 'a module hid a function'\n"
        "assert callable(gt_core.diagnostics) and gt_core.capture is capture\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_report_data_is_plain_json(ip):
    run(ip, "%%gt\n" + TRAIN.replace("STEPS", "8"))
    json.dumps(gt_core.report().to_data())
    assert torch.is_tensor(ip.user_ns["loss"])


def test_dashboard_parts_follow_the_data():
    dash = Dashboard(summarize([]), mode="notebook")
    empty = dash.bundles()
    assert empty["timeline"] == {} and empty["graph"] == {}  # nothing to draw yet
    dash.data = summarize(_events())
    parts = dash.bundles()
    assert "1 compiled" in parts["headline"]["text/plain"]
    fig = parts["timeline"]["application/vnd.plotly.v1+json"]
    xs = [len(tr.get("x") or ()) for tr in fig["data"]]
    assert max(xs) == 10  # ten iterations drawn
    names = {tr["name"] for tr in parts["graph"]["application/vnd.plotly.v1+json"]["data"]}
    assert names >= {"inputs", "ops", "outputs"}
    assert not any("widget" in mime for b in parts.values() for mime in b)


def test_a_failing_dashboard_never_breaks_the_cell(ip, monkeypatch, capsys):
    def boom(self, data=None):
        raise ValueError("drawing went wrong")

    monkeypatch.setattr(Dashboard, "finalize", boom)
    r = run(ip, "%%gt\nimport torch\nfine = torch.ones(2).sum().item()")
    assert r.success and ip.user_ns["fine"] == 2.0
    err = capsys.readouterr().err
    assert "dashboard failed (ValueError: drawing went wrong)" in err


def test_reasons_tell_a_sync_cut_from_a_divergence():
    events = _events() + [
        {
            "type": "mismatch",
            "t": 99.0,
            "signature": "abc",
            "position": 3,
            "expected": "aten.mm.default",
            "got": "sync point",
        },
        {
            "type": "mismatch",
            "t": 99.5,
            "signature": "abc",
            "position": 1,
            "expected": "aten.mm.default",
            "got": "aten.gelu.default",
        },
    ]
    rows = {r["kind"]: r for r in _tables.reason_rows(summarize(events))}
    assert rows["sync"]["reason"].startswith("1 occurrence(s) cut short by a sync point")
    assert "log every k steps" in rows["sync"]["what to do"]
    assert rows["mismatch"]["reason"] == "1 occurrence(s) diverged"


def test_user_compiles_get_a_timeline_of_their_own():
    user = [
        {
            "function": "kv_step",
            "limit_hit": True,
            "timeline": [
                {
                    "t": 10.0,
                    "seconds": 0.5,
                    "compile_id": "0/0",
                    "recompile": False,
                    "resume": False,
                },
                {
                    "t": 11.0,
                    "seconds": 0.2,
                    "compile_id": "0/1",
                    "recompile": True,
                    "resume": False,
                },
            ],
        }
    ]
    rows = _figures.compiles_data(user)
    assert [r["kind"] for r in rows] == ["compile", "recompile"] and rows[1]["at_s"] == 1.0
    fig = _figures.compiles(user)
    assert list(fig.data[0].y) == [0.5, 0.2] and "limit hit" in fig.layout.annotations[0].text
    assert _figures.compiles([]) is None
    data = {**summarize([]), "user_compiles": user}
    parts = Dashboard(data, mode="notebook").bundles()  # builds without a hot path
    assert parts["compiles"] and parts["timeline"] == {}
    assert "compiles and recompiles" in _render.figures_html(data)
