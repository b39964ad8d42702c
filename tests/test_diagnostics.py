"""gt_core.diagnostics(): the user's own torch.compile explained, each event kind on CPU.

Dynamo runs with backend="eager" (or a counting backend) so that tests stay fast; real
inductor and CUDA graphs are in the marked tests.
"""

import json
import logging
import re

import pytest
import torch
from conftest import assert_close

import gt_core
from gt_bench.examples.kv_cache import generate, make_models
from gt_core import events as ev
from gt_core.diagnostics import recompile_limit
from gt_core.diagnostics.watcher import Watcher
from gt_core.observe.user_compiles import summarize_user_compiles

HERE = __file__


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def user_events(kind=None):
    es = [e for e in gt_core.events_log().snapshot() if e["type"].startswith("user.")]
    return [e for e in es if e["type"] == kind] if kind else es


def user_compiles():
    return gt_core.report().to_data()["user_compiles"]


def logged(caplog, text: str) -> bool:
    """Whether a log record containing ``text`` reached the handlers (it would print)."""
    return any(text in r.getMessage() for r in caplog.records)


def line_of(text: str) -> int:
    """The line of this file that contains ``text`` (for file:line checks)."""
    with open(HERE) as f:
        return next(i for i, ln in enumerate(f, 1) if text in ln and "line_of" not in ln)


class Cache:
    def __init__(self):
        self.k = torch.zeros(16, 4)
        self._current_idx = [0]


cache = Cache()


def kv_step(x):
    i = cache._current_idx[0]
    if cache._current_idx[0] == 0:  # the guarded branch
        y = x * 2
    else:
        y = x + cache.k[i - 1]
    cache.k[i] = y
    cache._current_idx[0] += 1
    return y.sum()


def kv_eager(xs):
    k, out = torch.zeros(16, 4), []
    for i, x in enumerate(xs):
        y = x * 2 if i == 0 else x + k[i - 1]
        k[i] = y
        out.append(y.sum())
    return torch.stack(out)


def run_kv(xs, **compile_kw):
    cache.k.zero_()
    cache._current_idx[0] = 0
    f = torch.compile(kv_step, backend="eager", **compile_kw)
    return torch.stack([f(x) for x in xs])


# -- compiles and recompiles ---------------------------------------------------------------
def test_compile_event_has_function_id_time_split_graphs_and_ops():
    f = torch.compile(lambda x: (x.sin() + 1).sum(), backend="eager")
    x = torch.randn(5)
    with gt_core.diagnostics():
        assert_close(f(x), (x.sin() + 1).sum())
    (c,) = user_events(ev.USER_COMPILE)
    assert c["function"] == "<lambda>" and c["compile_id"] == "0/0"
    assert c["graphs"] == 1 and c["ops"] == 3
    assert c["seconds"] > 0 and c["dynamo_s"] > 0 and c["backend_s"] >= 0
    assert c["where"] == f"{HERE}:{line_of('lambda x: (x.sin() + 1).sum()')}"
    (u,) = user_compiles()
    assert u["compiles"] == 1 and u["recompile_reasons"] == [] and not u["limit_hit"]


def test_recompile_has_the_guard_and_the_user_source_line():
    xs = [torch.randn(4) for _ in range(3)]
    with gt_core.diagnostics():
        out = run_kv(xs)
    assert_close(out, kv_eager(xs))
    rec = user_events(ev.USER_RECOMPILE)
    assert [r["reason"] for r in rec] == [
        "G['cache']._current_idx[0] == 0",
        "G['cache']._current_idx[0] == 1",
    ]
    assert rec[0]["where"] == f"{HERE}:{line_of('# the guarded branch')}"
    assert rec[0]["source"].startswith("if cache._current_idx[0] == 0:")
    (u,) = user_compiles()
    assert u["function"] == "kv_step" and u["compiles"] == 3
    assert u["recompile_reasons"][0].startswith("G['cache']._current_idx[0] == 0  (")
    (x,) = [x for x in u["explanations"] if x["kind"] == "recompile"]
    assert x["id"] == "int_from_mutable_state" and x["count"] == 2
    assert "0-d tensor" in x["fix"]


# -- what torch did with a value after its recompile, read from its cache entries -----------
class _Cfg:
    n = 1


_cfg = _Cfg()


def _times_cfg(x):
    return x * _cfg.n


def _loop(x, n):
    for _ in range(n):
        x = x * 2
    return x


def _value_explained(f, calls, before=None):
    with gt_core.diagnostics():
        for i, args in enumerate(calls):
            if before is not None:
                before(i)
            f(*args)
    (u,) = user_compiles()
    (x,) = [x for x in u["explanations"] if x["kind"] == "recompile"]
    return u, x


def test_a_float_torch_made_dynamic_after_one_recompile_is_said_to_be_dynamic():
    """torch 2.13 compiles a Python float as a constant, then dynamic at its first recompile
    (automatic dynamic; ``specialize_float`` is off by default): twelve values are two
    compiles, and the words say so, never "each new value compiles a new graph" nor to set
    a config that is already set."""
    f = torch.compile(lambda x, s: x * s, backend="eager")
    u, x = _value_explained(f, [(torch.ones(3), 0.1 * i) for i in range(1, 13)])
    assert u["compiles"] == 2 and not torch._dynamo.config.specialize_float
    assert x["id"] == "value_made_dynamic" and "later values reuse that graph" in x["cause"]
    assert "each new value" not in x["cause"] and "specialize_float" not in x["fix"]


def test_an_int_argument_made_dynamic_is_said_to_be_dynamic():
    f = torch.compile(lambda x, n: x * n, backend="eager")
    u, x = _value_explained(f, [(torch.ones(3), n) for n in range(1, 8)])
    assert u["compiles"] == 2 and x["id"] == "value_made_dynamic", x
    assert "dynamic=True" in x["fix"]  # (from the first call: saves the one recompile)


def test_an_int_loop_count_stays_specialized_and_dynamic_true_is_not_advised():
    """A loop count torch must know: every value compiles, whatever ``dynamic`` says, so
    the words say it and do not advise ``dynamic=True`` as the fix. Five values are five
    graphs (the first compile's included)."""
    f = torch.compile(_loop, backend="eager")
    u, x = _value_explained(f, [(torch.ones(3), n) for n in range(1, 6)])
    assert u["compiles"] == 5 and x["id"] == "int_argument", x
    assert (
        "torch kept it specialized (5 graphs so far): each new value needs a graph of its own"
        in x["cause"]
    )
    assert "would not help" in x["cause"] and "dynamic=True" not in x["fix"]
    g = torch.compile(_loop, backend="eager", dynamic=True)  # (what the words claim)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=64):
        for n in range(1, 5):
            g(torch.ones(3), n)
    entries = len(torch._C._dynamo.eval_frame._debug_get_cache_entry_list(_loop.__code__))
    assert entries == 4


def test_an_int_read_from_an_object_stays_specialized():
    def set_n(i):
        _cfg.n = i + 1

    f = torch.compile(_times_cfg, backend="eager")
    u, x = _value_explained(f, [(torch.ones(3),)] * 5, before=set_n)
    assert u["compiles"] == 5 and x["id"] == "int_from_mutable_state", x
    assert "torch kept it specialized (5 graphs so far)" in x["cause"]
    assert "0-d tensor" in x["fix"]


def test_shape_change_recompile_is_explained():
    f = torch.compile(lambda x: x * 2, backend="eager")
    with gt_core.diagnostics():
        f(torch.randn(3))
        f(torch.randn(5))
    (r,) = user_events(ev.USER_RECOMPILE)
    assert r["reason"] == "tensor 'x' size mismatch at index 0. expected 3, actual 5"
    (x,) = user_compiles()[0]["explanations"]
    assert x["id"] == "shape_change" and "mark_dynamic(x, 0)" in x["fix"]


def test_grad_mode_change_is_explained():
    f = torch.compile(lambda x: x * 2, backend="eager")
    with gt_core.diagnostics():
        f(torch.randn(3))
        with torch.no_grad():
            f(torch.randn(3))
    assert [x["id"] for x in user_compiles()[0]["explanations"]] == ["grad_mode_change"]


# -- the recompile limit and the budget ----------------------------------------------------
def test_after_the_limit_a_call_that_fits_a_cached_graph_still_runs_compiled():
    """What the limit's explanation says, checked on the torch installed: once the limit is
    hit, inputs a cached graph was compiled for still run that graph; others run eagerly."""
    runs = []

    def counting(gm, example_inputs):
        def run(*args):
            runs.append(len(example_inputs))
            return gm.forward(*args)

        return run

    f = torch.compile(lambda x, n: x * n, backend=counting, dynamic=False)
    with gt_core.diagnostics(), torch._dynamo.config.patch(recompile_limit=2):
        for n in (1, 2, 3, 4):  # (3 and 4 are past the limit: eager, no new graph)
            f(torch.ones(2), n)
        before = len(runs)
        f(torch.ones(2), 2)  # (fits the second cached graph)
        f(torch.ones(2), 4)
    assert before == 2 and len(runs) == 3
    (u,) = user_compiles()
    (x,) = [x for x in u["explanations"] if x["kind"] == "limit_hit"]
    assert (
        "a call whose inputs pass the guards of one of its cached graphs still runs" in x["cause"]
    )


def test_limit_hit_is_reported_and_the_function_runs_eagerly_after(caplog):
    xs = [torch.randn(4) for _ in range(6)]
    with gt_core.diagnostics(), torch._dynamo.config.patch(recompile_limit=3):
        out = run_kv(xs)
    assert_close(out, kv_eager(xs))  # eager after the limit: still correct
    (hit,) = user_events(ev.USER_LIMIT_HIT)
    assert hit["function"] == "kv_step" and hit["limit"] == 3
    assert hit["limit_type"] == "recompile_limit"
    assert hit["last_reason"] == "G['cache']._current_idx[0] == 2"
    assert "compiles no new graph; calls that need one run eagerly" in hit["reason"]
    (u,) = user_compiles()
    assert u["compiles"] == 3 and u["limit_hit"] and u["limit"] == 3
    assert any(x["id"] == "recompile_limit" and "(3)" in x["cause"] for x in u["explanations"])
    assert not logged(caplog, "hit config.recompile_limit")  # no log spam


def test_budget_warning_before_the_limit():
    xs = [torch.randn(4) for _ in range(4)]
    with gt_core.diagnostics(), torch._dynamo.config.patch(recompile_limit=4):
        run_kv(xs)
    budgets = user_events(ev.USER_BUDGET)
    assert [b["message"].split(" (")[0] for b in budgets] == [
        "kv_step: 3 of the 4 graphs `recompile_limit` allows compiled",
        "kv_step: 4 of the 4 graphs `recompile_limit` allows compiled",
    ]
    assert not user_events(ev.USER_LIMIT_HIT)
    (u,) = user_compiles()
    assert u["budget"] == {"used": 4, "limit": 4, "message": budgets[-1]["message"]}
    (x,) = [x for x in u["explanations"] if x["kind"] == "budget"]
    assert x["cause"] == budgets[-1]["message"]


def test_recompile_limit_reads_the_config():
    with torch._dynamo.config.patch(recompile_limit=5):
        assert recompile_limit() == 5
    with torch._dynamo.config.patch(cache_size_limit=6):  # the older name of the same setting
        assert recompile_limit() == 6


# -- graph breaks --------------------------------------------------------------------------
def breaks_on_print(x):
    y = x.sin()
    print("step")  # breaks the graph
    return y.cos()


def breaks_on_item(x):
    v = x.sum().item()  # breaks the graph too
    return x * v


def test_graph_break_has_reason_and_where(caplog):
    x = torch.randn(3)
    f = torch.compile(breaks_on_print, backend="eager")
    with gt_core.diagnostics():
        assert_close(f(x), x.sin().cos())
    (b,) = user_events(ev.USER_GRAPH_BREAK)
    assert b["function"] == "breaks_on_print"
    assert b["where"] == f"{HERE}:{line_of('# breaks the graph')}"
    assert "builtin operator `print`" in b["reason"]
    (u,) = user_compiles()
    assert u["graph_breaks"] == [  # (its one call compiled: no compiled call ran the break)
        {
            "reason": b["reason"],
            "where": b["where"],
            "count": 1,
            "stack": b["stack"],
            "calls": None,
            "outside_ms": None,
        }
    ]
    assert b["stack"][-1] == {
        "where": b["where"],
        "function": "breaks_on_print",
        "text": 'print("step")  # breaks the graph',
    }
    assert u["compiles"] == 1 and u["graphs"] == 2  # the resume function is its second graph
    assert [x["id"] for x in u["explanations"]] == ["print"]
    assert not logged(caplog, "Graph break")


def calls_a_printer(x):
    return breaks_on_print(x) * 2  # calls the function that breaks


def test_a_graph_break_in_a_called_function_has_the_users_stack_down_to_it():
    x = torch.randn(3)
    f = torch.compile(calls_a_printer, backend="eager")
    with gt_core.diagnostics():
        assert_close(f(x), x.sin().cos() * 2)
    # (the break is met twice: inlined into calls_a_printer's frame, then in breaks_on_print's
    # own, where Dynamo suppresses the repeated stack)
    b = next(b for b in user_events(ev.USER_GRAPH_BREAK) if b["function"] == "calls_a_printer")
    assert b["where"] == f"{HERE}:{line_of('# breaks the graph')}"
    frames = [(s["where"], s["function"]) for s in b["stack"]]
    assert frames[-2:] == [
        (f"{HERE}:{line_of('# calls the function that breaks')}", "calls_a_printer"),
        (b["where"], "breaks_on_print"),
    ]
    u = next(u for u in user_compiles() if u["function"] == "calls_a_printer")
    assert u["graph_breaks"][0]["stack"] == b["stack"]


def test_item_graph_break_suggests_capture_scalar_outputs(caplog):
    f = torch.compile(breaks_on_item, backend="eager")
    x = torch.randn(3)
    with gt_core.diagnostics():
        assert_close(f(x), x * x.sum())
    assert not logged(caplog, "Graph break")  # Dynamo's own .item() warning included
    (b,) = user_events(ev.USER_GRAPH_BREAK)
    assert b["where"] == f"{HERE}:{line_of('# breaks the graph too')}"
    x = next(x for x in user_compiles()[0]["explanations"] if x["kind"] == "graph_break")
    assert x["id"] == "item" and "capture_scalar_outputs" in x["fix"]


def steers_on_item(x):
    if x.sum().item() > 0:  # a branch on a tensor's value
        return x * 2
    return x


def test_an_item_that_steers_an_if_is_not_told_capture_scalar_outputs():
    """capture_scalar_outputs keeps an .item() in the graph, not a Python ``if`` on it: the
    fix for this break is torch.where or torch.cond (checked on the torch installed)."""
    with gt_core.diagnostics():
        torch.compile(steers_on_item, backend="eager")(torch.ones(3))
    x = next(x for x in user_compiles()[0]["explanations"] if x["kind"] == "graph_break")
    assert x["id"] == "item_steers_python" and "torch.where" in x["fix"], x
    assert "if x.sum().item() > 0:" in x["cause"] and "= True" not in x["fix"]
    torch._dynamo.reset()
    gt_core.reset()
    with gt_core.diagnostics(), torch._dynamo.config.patch(capture_scalar_outputs=True):
        torch.compile(steers_on_item, backend="eager")(torch.ones(3))
    assert user_events(ev.USER_GRAPH_BREAK)  # (the break stays)


def test_graph_break_under_fullgraph_is_a_failure_with_its_break():
    f = torch.compile(breaks_on_print, backend="eager", fullgraph=True)
    with pytest.raises(Exception, match="print"):
        with gt_core.diagnostics():
            f(torch.randn(3))
    (fail,) = user_events(ev.USER_FAILURE)
    assert fail["kind"] == "fullgraph" and fail["function"] == "breaks_on_print"
    (b,) = user_events(ev.USER_GRAPH_BREAK)
    assert b["where"] == f"{HERE}:{line_of('# breaks the graph')}"
    (u,) = user_compiles()
    assert u["compiles"] == 0
    assert [x["id"] for x in u["explanations"]] == ["fullgraph", "print"]


def test_graph_break_reasons_come_from_the_metrics_without_the_log(monkeypatch):
    monkeypatch.setattr(Watcher, "on_break_log", lambda self, record: False)
    f = torch.compile(breaks_on_print, backend="eager")
    with gt_core.diagnostics():
        f(torch.randn(3))
    (b,) = user_events(ev.USER_GRAPH_BREAK)
    assert "builtin operator `print`" in b["reason"] and b["where"] == ""


# -- cudagraph skips -----------------------------------------------------------------------
def test_cudagraph_skip_counted_without_a_reason():
    """The CPU path: inductor only bumps counters["inductor"]["cudagraph_skips"]."""
    from torch._dynamo.utils import counters

    def skipping_backend(gm, example_inputs):
        counters["inductor"]["cudagraph_skips"] += 1  # as inductor does for CPU graphs
        return gm.forward

    f = torch.compile(lambda b, x: b.add_(x).sum(), backend=skipping_backend)
    buf = torch.zeros(3)
    with gt_core.diagnostics():
        f(buf, torch.ones(3))
    assert_close(buf, torch.ones(3))
    (s,) = user_events(ev.USER_CUDAGRAPH_SKIP)
    assert s["count"] == 1 and not s["logged"] and "no reason logged" in s["reason"]
    (u,) = user_compiles()
    assert len(u["cudagraph_skips"]) == 1
    assert [x["id"] for x in u["explanations"]] == ["cpu_device"]


@pytest.mark.inductor
def test_reduce_overhead_on_cpu_reports_the_skip():
    def step(buf, x):
        buf.add_(x)
        return (buf * 2).sum()

    f = torch.compile(step, mode="reduce-overhead")
    buf = torch.zeros(4)
    with gt_core.diagnostics():
        out = f(buf, torch.ones(4))
    assert_close(out, torch.tensor(8.0))
    (s,) = user_events(ev.USER_CUDAGRAPH_SKIP)
    assert s["function"] == "step" and not s["logged"]
    (c,) = user_events(ev.USER_COMPILE)
    assert c["backend_s"] > 0 and c["aot_s"] is not None  # inductor_s: None on a cache hit


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cudagraph_skip_reason_mutated_inputs_on_gpu(caplog):
    def step(buf, x):
        buf.add_(x)
        return (buf * 2).sum()

    f = torch.compile(step, mode="reduce-overhead")
    buf = torch.zeros(4, device="cuda")
    with gt_core.diagnostics():
        for _ in range(3):
            f(buf, torch.ones(4, device="cuda"))
    torch.cuda.synchronize()
    skips = [s for s in user_events(ev.USER_CUDAGRAPH_SKIP) if s["logged"]]
    assert skips and "mutated inputs" in skips[0]["reason"]
    assert any(x["id"] == "mutated_inputs" for x in user_compiles()[0]["explanations"])
    assert not logged(caplog, "skipping cudagraphs")


# -- strict stances ------------------------------------------------------------------------
def test_fail_on_recompile_stance_is_reported_and_still_raises():
    f = torch.compile(lambda x: x * 2, backend="eager")
    f(torch.randn(3))
    with pytest.raises(RuntimeError, match="fail_on_recompile"):
        with gt_core.diagnostics(), torch.compiler.set_stance("fail_on_recompile"):
            f(torch.randn(5))
    (fail,) = user_events(ev.USER_FAILURE)
    assert fail["kind"] == "fail_on_recompile" and fail["function"] == "<lambda>"
    assert fail["guard"] == "tensor 'x' size mismatch at index 0. expected 3, actual 5"
    assert any(x["id"] == "fail_on_recompile" for x in user_compiles()[0]["explanations"])


def test_error_on_recompile_config_is_reported():
    f = torch.compile(lambda x: x * 2, backend="eager")
    with pytest.raises(Exception, match="Recompiling function"):
        with gt_core.diagnostics(), torch._dynamo.config.patch(error_on_recompile=True):
            f(torch.randn(3))
            f(torch.randn(5))
    (fail,) = user_events(ev.USER_FAILURE)
    assert fail["kind"] == "error_on_recompile" and fail["function"] == "<lambda>"
    assert "size mismatch" in fail["reason"]


# -- hooks in and out ----------------------------------------------------------------------
def _state():
    import torch._dynamo.convert_frame as convert_frame
    import torch._dynamo.eval_frame as eval_frame
    import torch._dynamo.utils as utils

    names = [
        "torch._dynamo.symbolic_convert.__graph_breaks",
        "torch._dynamo.convert_frame",
        "torch._inductor.cudagraph_utils.__cudagraphs",
    ]
    logs = [(logging.getLogger(n).level, list(logging.getLogger(n).filters)) for n in names]
    hooks = (
        utils.log_compilation_event,
        eval_frame._callback_from_stance,
        convert_frame.get_and_maybe_log_recompilation_reasons,
    )
    return logs, hooks


def test_logging_and_hooks_are_restored_on_exit(caplog):
    before = _state()
    f = torch.compile(breaks_on_print, backend="eager")
    with gt_core.diagnostics():
        f(torch.randn(3))
        assert _state() != before
    assert _state() == before
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=1):  # Dynamo warns again outside
        run_kv([torch.randn(4), torch.randn(4)])
    assert logged(caplog, "hit config.recompile_limit (1)")


def test_missing_api_is_a_failure_event_not_an_error(monkeypatch):
    import torch._dynamo.utils as utils

    monkeypatch.delattr(utils, "log_compilation_event")
    f = torch.compile(lambda x: x + 1, backend="eager")
    x = torch.randn(3)
    with gt_core.diagnostics():
        assert_close(f(x), x + 1)
    (fail,) = user_events(ev.USER_FAILURE)
    assert fail["kind"] == "unavailable" and "log_compilation_event" in fail["reason"]
    assert len(user_events(ev.USER_COMPILE)) == 1  # read from get_compilation_metrics() on exit


def test_names_stay_right_across_a_dynamo_reset():
    f = torch.compile(lambda x: x - 1, backend="eager")
    with gt_core.diagnostics():
        f(torch.randn(3))
        torch._dynamo.reset()  # frame ids start again at 0
        torch.compile(breaks_on_item, backend="eager")(torch.randn(3))
    assert [c["function"] for c in user_events(ev.USER_COMPILE)] == [
        "<lambda>",
        "breaks_on_item",
        "breaks_on_item",  # its resume function after the break
    ]
    (u,) = [u for u in user_compiles() if u["function"] == "<lambda>"]
    assert [c["compile_id"] for c in u["timeline"]] == ["0/0"] and u["timeline"][0]["seconds"] > 0


def test_nested_diagnostics_report_each_event_once():
    f = torch.compile(lambda x: x - 1, backend="eager")
    with gt_core.diagnostics(), gt_core.diagnostics():
        f(torch.randn(3))
    assert len(user_events(ev.USER_COMPILE)) == 1


def test_compiles_outside_the_block_are_not_reported():
    f = torch.compile(lambda x: x * 3, backend="eager")
    f(torch.randn(3))
    with gt_core.diagnostics():
        f(torch.randn(3))  # cached: no compile
    f(torch.randn(4))
    calls = user_events(ev.USER_CALLS)  # (the one call inside: counted, ran compiled)
    assert [e for e in user_events() if e["type"] != ev.USER_CALLS] == []
    assert [(e["calls"], e["outcomes"]) for e in calls] == [(1, {"compiled": 1})]


# -- data ----------------------------------------------------------------------------------
def test_summarize_user_compiles_gives_one_typed_entry_per_function():
    xs = [torch.randn(4) for _ in range(3)]
    g = torch.compile(breaks_on_print, backend="eager")
    with gt_core.diagnostics():
        run_kv(xs)
        g(torch.randn(3))
    data = user_compiles()
    assert [u["function"] for u in data] == ["kv_step", "breaks_on_print"]
    types = {
        "function": str,
        "compiles": int,
        "recompile_reasons": list,
        "graph_breaks": list,
        "limit_hit": bool,
        "cudagraph_skips": list,
        "explanations": list,
        "entries": list,
    }
    for u in data:
        for k, t in types.items():
            assert isinstance(u[k], t), k
        for b in u["graph_breaks"]:
            assert isinstance(b["reason"], str) and re.fullmatch(r".+:\d+", b["where"])
        for x in u["explanations"]:
            assert isinstance(x["cause"], str) and isinstance(x["fix"], str)
    # Pure: the same data from the saved events alone, also after a JSON round trip.
    events = gt_core.events_log().snapshot()
    assert summarize_user_compiles(events) == data
    assert summarize_user_compiles(json.loads(json.dumps(events))) == data
    text = str(gt_core.report())
    # (compile time in the text: the whole, then by phase)
    assert re.search(r"torch.compile kv_step: 3 compile\(s\) in \d+\.\d\d s \(dynamo \d", text)
    assert ", 2 recompile(s)" in text


def test_dashboard_tables_show_the_explanations():
    from gt_jupyter import _tables

    with gt_core.diagnostics():
        run_kv([torch.randn(4) for _ in range(3)])
    data = gt_core.report().to_data()
    (row,) = _tables.user_rows(data)
    assert row["function"] == "kv_step" and row["recompiles"] == 2
    (r,) = [r for r in _tables.reason_rows(data) if r["kind"] == "recompile"]
    assert "0-d tensor" in r["what to do"]
    assert r["reason"].endswith(f"(at {HERE}:{line_of('# the guarded branch')}) ×2")


# -- explain -------------------------------------------------------------------------------
def test_explain_lists_cache_entries_and_their_guards():
    xs = [torch.randn(4) for _ in range(3)]
    f = torch.compile(kv_step, backend="eager")
    cache.k.zero_()
    cache._current_idx[0] = 0
    for x in xs:
        f(x)
    text = gt_core.diagnostics.explain(f)
    assert text.startswith("kv_step: 3 cache entries")
    for i, cid in enumerate(["0/2", "0/1", "0/0"]):  # newest first, each with its own guard
        assert f"entry {cid}:" in text
        assert f"G['cache']._current_idx[0] == {2 - i}" in text
    assert gt_core.diagnostics.explain("f") == text  # by name, from the caller's scope


def test_explain_tells_entries_of_eight_batch_sizes_apart():
    """Eight static batch sizes, eight entries: each entry's line names its own size."""
    f = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    sizes = [1, 2, 3, 4, 5, 6, 7, 9]
    with torch._dynamo.config.patch(recompile_limit=16):
        for n in sizes:
            f(torch.randn(n, 4))
    text = gt_core.diagnostics.explain(f)
    own = [ln for ln in text.splitlines() if "size=[" in ln]
    assert len({ln.strip() for ln in own}) == len(sizes) == len(own), text
    for n in sizes:
        assert any(f"size=[{n}, 4]" in ln for ln in own), text


def test_explain_a_module_and_a_function_not_yet_called():
    m = torch.compile(torch.nn.Linear(3, 2), backend="eager")
    assert "no cache entries" in gt_core.diagnostics.explain(m)
    m(torch.randn(4, 3))
    assert gt_core.diagnostics.explain(m).startswith("Linear: 1 cache entry")
    with pytest.raises(TypeError, match="expected a function or module"):
        gt_core.diagnostics.explain(3)
    with pytest.raises(NameError, match="no function named 'nope'"):
        gt_core.diagnostics.explain("nope")


# -- routed cells (inside gt_core.capture) -------------------------------------------------
def test_compiled_function_in_a_capture_runs_through_gt_and_is_reported(inprocess):
    from torch._dynamo.utils import counters

    def g(x, w):
        return torch.tanh(x @ w).sum(0)

    f = torch.compile(g, backend="eager")
    x, w = torch.randn(4, 3), torch.randn(3, 2)
    frames = counters["frames"]["total"]
    with gt_core.diagnostics(), gt_core.capture():
        y = f(gt_core.to_worker(x), gt_core.to_worker(w))
        y2 = f(gt_core.to_worker(x) * 2, gt_core.to_worker(w))
    assert gt_core.is_remote(y)
    assert_close(y, g(x, w))
    assert_close(y2, g(x * 2, w))
    assert counters["frames"]["total"] == frames  # Dynamo traced nothing (not gt's internals)
    (r,) = user_events(ev.USER_ROUTED)
    assert r["function"] == "g"  # as a compile of g would be named
    assert "Dynamo does not trace them" in r["message"]
    (u,) = user_compiles()
    assert u["routed"] and u["compiles"] == 0
    assert u["explanations"][0]["id"] == "routed"
    # Outside the capture the same compiled function compiles as usual.
    with gt_core.diagnostics():
        assert_close(f(x, w), g(x, w))
    assert len(user_events(ev.USER_COMPILE)) == 1


def test_compiled_function_in_a_capture_with_the_worker_process(process):
    f = torch.compile(lambda x: torch.relu(x - 0.5).cumsum(0), backend="eager")
    x = torch.randn(6)
    with gt_core.diagnostics(), gt_core.capture():
        y = f(gt_core.to_worker(x))
    assert_close(y, torch.relu(x - 0.5).cumsum(0))
    assert [e["function"] for e in user_events(ev.USER_ROUTED)] == ["<lambda>"]
    assert not user_events(ev.USER_COMPILE)


def test_compiled_training_step_in_a_capture_is_compiled_by_the_hot_path(inprocess):
    gt_core.configure(auto_compile=True, threshold=3)

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def train(model, x, y, steps=12):
        step = torch.compile(lambda: torch.nn.functional.mse_loss(model(x), y), backend="eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for _ in range(steps):
            loss = step()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        return torch.stack(losses)

    x, y = torch.randn(16, 6), torch.randn(16, 1)
    ref = train(build(), x, y)
    with gt_core.capture():
        model = build()
        got = train(model, gt_core.to_worker(x), gt_core.to_worker(y))
        gt_core.wait(compiles=True, timeout=60)
    assert_close(got, ref, atol=1e-5, rtol=1e-4)
    data = gt_core.report().to_data()
    assert any(p["status"] == "compiled" for p in data["hot_paths"])
    assert [u["function"] for u in data["user_compiles"] if u["routed"]]


@pytest.mark.parametrize("background", [False, True])
def test_gts_own_compiles_are_not_the_users(inprocess, background):
    """gt compiles hot paths with Dynamo too (dynamic=True): not a torch.compile of the user."""
    gt_core.configure(
        auto_compile=True, threshold=3, min_seq=3, dynamic=True, background=background
    )
    a = torch.randn(8, 8)
    with gt_core.diagnostics(), gt_core.capture():
        x = gt_core.to_worker(a)
        for _ in range(16):
            x = torch.tanh(x @ x.T) * 0.5
        gt_core.wait(compiles=True, timeout=60)
    ref = a
    for _ in range(16):
        ref = torch.tanh(ref @ ref.T) * 0.5
    assert_close(x, ref, atol=1e-5, rtol=1e-4)
    assert any(e["type"] == ev.COMPILE_FINISHED for e in gt_core.events_log().snapshot())
    assert user_events() == []


# -- the KV-cache case of the tutorial ----------------------------------------------------
def test_kv_cache_recompiles_per_step_and_the_fix_compiles_once():
    buggy, fixed = make_models(layers=2, max_len=16)
    x0 = torch.randn(2, 1)
    with torch.no_grad():
        ref = generate(buggy, x0, 12)
    buggy.reset()
    with gt_core.diagnostics():
        out_buggy = generate(torch.compile(buggy, backend="eager"), x0, 12)
        out_fixed = generate(torch.compile(fixed, backend="eager"), x0, 12)
    limit = recompile_limit()
    by_fn = {u["function"]: u for u in user_compiles()}
    bad, good = by_fn["KVForecaster"], by_fn["FixedForecaster"]
    assert bad["compiles"] == limit and bad["limit_hit"]
    assert bad["recompile_reasons"][0].startswith("self.kv_cache._current_idx[0] == 0")
    assert bad["explanations"][0]["id"] == "int_from_mutable_state"
    assert good["compiles"] <= 2 and not good["limit_hit"] and not good["recompile_reasons"]
    assert (out_buggy - ref).abs().mean() < 1e-5
    assert (out_fixed - ref).abs().mean() < 1e-5


def test_kv_fixed_model_in_a_capture_equals_eager(inprocess):
    gt_core.configure(auto_compile=True, threshold=3)
    _, fixed = make_models(layers=2, max_len=16)
    x0 = torch.randn(2, 1)
    with torch.no_grad():
        ref = generate(fixed, x0, 12)
    fixed.reset()
    step = torch.compile(fixed, backend="eager")
    with gt_core.capture():
        gt_core.to_worker(fixed)
        out = generate(step, gt_core.to_worker(x0), 12)
        gt_core.wait(compiles=True, timeout=60)
    assert (out.cpu() - ref).abs().mean() < 1e-5
    data = gt_core.report().to_data()
    assert [p["status"] for p in data["hot_paths"]] == ["compiled"]
    (u,) = data["user_compiles"]
    assert u["function"] == "FixedForecaster" and u["routed"]


# -- through the magics --------------------------------------------------------------------
@pytest.fixture
def ip():
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gt_jupyter")
    yield shell
    shell.run_line_magic("unload_ext", "gt_jupyter")


def test_local_cell_explains_its_torch_compile_and_gt_explain_shows_guards(ip):
    ip.user_ns.update(cache=cache, kv_step=kv_step)
    cache.k.zero_()
    cache._current_idx[0] = 0
    cell = (
        "%%gt --local\n"
        "import torch\n"
        "f = torch.compile(kv_step, backend='eager')\n"
        "out = [f(torch.ones(4)) for _ in range(3)]\n"
    )
    r = ip.run_cell(cell, store_history=False)
    assert r.success, r.error_in_exec
    dash = ip.magics_manager.registry["GTMagics"].dashboard
    (u,) = dash.data["user_compiles"]
    assert u["function"] == "kv_step" and u["compiles"] == 3
    assert "0-d tensor" in dash.to_text()
    assert [o.item() for o in ip.user_ns["out"]] == [8.0, 12.0, 16.0]  # eager: x*2, then x + k
    text = ip.run_line_magic("gt", "explain f").text
    assert text.startswith("kv_step: 3 cache entries")
    assert "G['cache']._current_idx[0] == 2" in text
