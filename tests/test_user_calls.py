"""Each call of a user's compiled function: its outcome (compiled, compiling, eagerly), its
time, and eager samples that time the compiled calls against eager on the same inputs.

Outcomes are checked against what torch did (a counting backend counts the graphs that ran,
the cache entries count the compiles); times come from an injected clock where a number is
asserted, so no test depends on the machine's speed.
"""

import pytest
import torch
from conftest import ManualClock

import gt_core
from gt_core.diagnostics.calls import SAMPLES, Calls, inputs_key
from gt_core.observe import events as ev
from gt_core.observe.user_compiles import calls_text
from gt_jupyter._render import to_html, to_text
from gt_jupyter._tables import USER_COLUMNS, user_rows

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Counting:
    """A backend that runs the graph as it is and counts its runs and its compiles."""

    def __init__(self):
        self.runs = 0
        self.compiled_at: list[int] = []  # the call index at each compile
        self.call = 0

    def __call__(self, gm, example_inputs):
        self.compiled_at.append(self.call)

        def run(*args):
            self.runs += 1
            return gm(*args)

        return run


def calls_of(name: str) -> dict:
    u = next(u for u in gt_core.report().to_data()["user_compiles"] if u["function"] == name)
    return u


def _loop(x, n):
    for _ in range(n):
        x = x.sin()
    return x


def test_calls_past_the_limit_count_as_eager_and_cached_values_as_compiled():
    """A loop count takes 5 values with a recompile limit of 3: the first call of 1, 2 and 3
    compiles; later calls of those run compiled; every call of 4 or 5 runs eagerly. Each
    count is what torch's cache and the backend's runs say."""
    backend = Counting()
    f = torch.compile(_loop, backend=backend)
    ns = [1 + i % 5 for i in range(40)]
    with torch._dynamo.config.patch(recompile_limit=3), gt_core.diagnostics(eager_every=0):
        for n in ns:
            f(torch.randn(3), n)
    c = calls_of("_loop")["calls"]
    assert len(backend.compiled_at) == 3
    past = sum(n > 3 for n in ns)
    assert c["calls"] == 40
    assert c["outcomes"] == {"compiled": 40 - 3 - past, "compiling": 3, "eager": past}
    assert backend.runs == 40 - past  # (graphs ran in exactly the compiled and compiling calls)
    text = calls_text(calls_of("_loop"))
    assert f"{past} eagerly (past the recompile limit" in text
    assert "not measured (eager samples off" in text


def test_eager_samples_run_eagerly_give_eagers_result_and_are_capped():
    backend = Counting()
    f = torch.compile(lambda x: (x @ x).relu().sum(), backend=backend)
    x = torch.randn(16, 16)
    with gt_core.diagnostics(eager_every=4):
        got = [f(x) for _ in range(60)]
    c = calls_of("<lambda>")["calls"]
    assert c["samples"] == SAMPLES and c["outcomes"]["eager_sample"] == SAMPLES
    assert c["outcomes"] == {"compiled": 60 - 1 - SAMPLES, "compiling": 1, "eager_sample": SAMPLES}
    assert backend.runs == 60 - SAMPLES  # (a sample runs no graph)
    want = (x @ x).relu().sum()
    assert all(torch.equal(g, want) for g in got)
    assert c["speedup"] is not None and c["compared"] == SAMPLES


def test_a_sample_never_moves_a_recompile():
    """Samples are taken only where the inputs equal the last compiled call's: the calls
    that compile are the same with samples on and off."""
    shapes = [3] * 5 + [4] * 5 + [3] * 3 + [5] * 6

    def compiled_at(every):
        torch._dynamo.reset()
        backend = Counting()
        f = torch.compile(lambda x: x.cos() * 2, backend=backend, dynamic=False)
        with gt_core.diagnostics(eager_every=every):
            for i, s in enumerate(shapes):
                backend.call = i
                f(torch.ones(s))
        return backend.compiled_at

    assert compiled_at(2) == compiled_at(0) == [0, 5, 13]


def test_a_graph_break_resumed_compiled_is_a_compiled_call():
    def g(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    f = torch.compile(g, backend="eager")
    with gt_core.diagnostics(eager_every=0):
        for _ in range(6):
            f(torch.ones(3))
    assert calls_of("g")["calls"]["outcomes"] == {"compiling": 1, "compiled": 5}


def test_calls_in_the_report_text_and_the_dashboard_table():
    f = torch.compile(lambda x: x + 1, backend="eager")
    with gt_core.diagnostics(eager_every=3):
        for _ in range(12):
            f(torch.ones(2))
    text = str(gt_core.report())
    assert "12 call(s): " in text and "x eager on the same inputs" in text
    data = gt_core.report().to_data()
    row = user_rows(data)[0]
    assert row["calls"] == 12 and row["compiled calls"] >= 1 and row["vs eager"].endswith("x")
    # what the cell's dashboard draws: the table's columns and the text's line
    page = to_html(data, figures=False)
    for column in ("calls", "compiled calls", "eager calls", "vs eager"):
        assert f">{column}</th>" in page
    assert f">{row['vs eager']}</td>" in page
    assert "12 call(s): " in to_text(data)
    assert set(row) == set(USER_COLUMNS)  # (every value a row carries has its column)


# -- the tally itself, on made-up frames and an injected clock ------------------------------
class _Frame:
    def __init__(self, *args):
        self.f_locals = {"cleanups": [], "args": args, "kwargs": {}}


def _run(calls: Calls, clock: ManualClock, ms: float, hit: bool = True, compiles=False, arg=1.0):
    frame = _Frame(arg)
    sample = calls.begin("f", None, frame)
    if not sample:
        calls.guard(hit, None)
    if compiles:
        calls.compiled_now()
    clock.t += ms / 1e3
    for cleanup in frame.f_locals["cleanups"]:
        cleanup()
    return sample


def test_the_speedup_is_each_samples_eager_time_over_the_compiled_median():
    events, clock = [], ManualClock()
    calls = Calls(lambda t, **f: events.append((t, f)), every=3, clock=clock, emit_every_s=1e9)
    _run(calls, clock, 100.0, hit=False, compiles=True)  # (the first call compiles)
    taken = [_run(calls, clock, 2.0 if i % 3 != 2 else 8.0) for i in range(9)]
    assert taken == [False, False, True] * 3  # (the third compiled call after each sample)
    calls.flush()
    t, snap = events[-1]
    assert t == ev.USER_CALLS and snap["function"] == "f"
    assert snap["outcomes"] == {"compiled": 6, "compiling": 1, "eager_sample": 3}
    assert snap["median_ms"] == {"compiled": 2.0, "compiling": 100.0, "eager_sample": 8.0}
    assert snap["speedup"] == 4.0 and snap["compared"] == 3


def test_no_speedup_is_said_before_three_samples_one_costly_sample_does_not_decide():
    """Two samples, the first paying a one-time cost (7x the second): no speedup yet, and
    the text says how many samples it has of those it takes; the third decides by the
    median, so the costly one does not."""
    events, clock = [], ManualClock()
    calls = Calls(lambda t, **f: events.append(f), every=3, clock=clock, emit_every_s=1e9)
    _run(calls, clock, 100.0, hit=False, compiles=True)
    eager = iter([14.0, 2.0, 2.4])
    for i in range(6):
        _run(calls, clock, next(eager) if i % 3 == 2 else 1.0)
    calls.flush()
    snap = events[-1]
    assert snap["compared"] == 2 and snap["speedup"] is None
    text = calls_text({"calls": snap})
    assert "not measured yet (2 eager sample(s) of the 3 it takes" in text and "x eager" not in text
    for i in range(3):
        _run(calls, clock, next(eager) if i % 3 == 2 else 1.0)
    calls.flush()
    assert events[-1]["compared"] == 3 and events[-1]["speedup"] == 2.4


def test_a_call_with_hits_and_misses_ran_partly_eagerly():
    events, clock = [], ManualClock()
    calls = Calls(lambda t, **f: events.append(f), every=0, clock=clock)
    frame = _Frame(1.0)
    calls.begin("f", None, frame)
    calls.guard(True, None), calls.guard(False, None)  # (a resume function past its limit)
    frame.f_locals["cleanups"][0]()
    calls.flush()
    assert events[-1]["outcomes"] == {"partly_eager": 1}


def test_snapshots_are_published_at_most_every_emit_every_s():
    events, clock = [], ManualClock()
    calls = Calls(lambda t, **f: events.append(f), every=0, clock=clock, emit_every_s=1.0)
    for _ in range(5):
        _run(calls, clock, 100.0)  # (0.1 s a call)
    assert len(events) == 1  # (the first, then none within the second)
    clock.t += 1.0
    _run(calls, clock, 1.0)
    assert len(events) == 2 and events[-1]["calls"] == 6


def test_inputs_key_tells_shapes_numbers_grad_mode_and_train_eval_apart():
    m = torch.nn.Linear(2, 2)
    x = torch.ones(2, 3)
    k = inputs_key(m.forward, (x, 1), {})
    assert k == inputs_key(m.forward, (torch.zeros(2, 3), 1), {})
    assert k != inputs_key(m.forward, (torch.ones(3, 2).t(), 1), {})  # (strides)
    assert k != inputs_key(m.forward, (x, 2), {})
    with torch.no_grad():
        assert k != inputs_key(m.forward, (x, 1), {})
    m.eval()
    assert k != inputs_key(m.forward, (x, 1), {})


class _Code:
    def __init__(self, filename):
        self.co_filename = filename


class _Caller:
    """A frame that called a checked one: the user's, at a graph break's line."""

    def __init__(self, filename, line):
        self.f_code, self.f_lineno = _Code(filename), line


def test_time_between_graphs_is_the_break_sites_whose_resume_function_comes_next():
    """graph 0 (2 ms), the break at cell.py:3 runs its Python (5 ms) and calls its resume
    function, graph 1 (1 ms), the break at cell.py:6 (0.5 ms), graph 2 (1 ms): each break's
    time is the time from the graph before it to the check of its resume function."""
    events, clock = [], ManualClock()
    calls = Calls(lambda t, **f: events.append(f), every=0, clock=clock)
    graph = calls.wrap_graph(lambda ms: setattr(clock, "t", clock.t + ms / 1e3))
    for _ in range(2):
        frame = _Frame(1.0)
        calls.begin("f", None, frame)
        calls.guard(True, None)  # (the function's own frame)
        graph(2.0)
        clock.t += 0.005
        calls.guard(True, _Caller("cell.py", 3))
        graph(1.0)
        clock.t += 0.0005
        calls.guard(True, _Caller("cell.py", 6))
        graph(1.0)
        frame.f_locals["cleanups"][0]()
    calls.flush()
    snap = events[-1]
    assert snap["outcomes"] == {"compiled": 2} and snap["graph_ms"] == pytest.approx(4.0)
    assert snap["breaks"] == [
        {"where": "cell.py:3", "calls": 2, "ms": pytest.approx(10.0)},
        {"where": "cell.py:6", "calls": 2, "ms": pytest.approx(1.0)},
    ]


def _two_breaks(x):
    y = x.sin()
    print("", end="")
    y = y * 2
    torch._dynamo.graph_break()
    return y.cos()


def test_a_real_functions_breaks_are_counted_in_calls_at_their_lines():
    f = torch.compile(_two_breaks, backend="eager")
    with gt_core.diagnostics(eager_every=0):
        for _ in range(7):
            f(torch.ones(3))
    u = calls_of("_two_breaks")
    lines = {b["where"].rsplit(":", 1)[-1] for b in u["calls"]["breaks"]}
    first = _two_breaks.__code__.co_firstlineno
    assert lines == {str(first + 2), str(first + 4)}
    assert all(b["calls"] == 6 for b in u["calls"]["breaks"])  # (the 6 compiled calls)
    assert u["calls"]["graph_ms"] is not None


def test_breaks_are_ranked_by_their_time_outside_the_graphs_in_calls():
    from gt_core.observe.user_compiles import breaks_text, summarize_user_compiles

    log = [
        {"type": ev.USER_GRAPH_BREAK, "function": "f", "reason": "print", "where": "c.py:3"},
        {"type": ev.USER_GRAPH_BREAK, "function": "f", "reason": ".item()", "where": "c.py:5"},
        {
            "type": ev.USER_CALLS,
            "function": "f",
            "calls": 41,
            "outcomes": {"compiled": 40},
            "breaks": [
                {"where": "c.py:5", "calls": 40, "ms": 80.0},
                {"where": "c.py:3", "calls": 40, "ms": 2.0},
            ],
        },
    ]
    u = summarize_user_compiles(log)[0]
    assert [b["where"] for b in u["graph_breaks"]] == ["c.py:5", "c.py:3"]
    assert breaks_text(u)[0] == (
        "graph break at c.py:5: in 40 compiled call(s), 80 ms outside the graphs (2 ms a call)"
    )


def test_a_library_model_with_a_decorated_forward_is_one_function_its_calls_and_compiles():
    """transformers decorates forward (its code is the decorator's ``wrapper``): compiles and
    calls are both named by what the user compiled, in one entry."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    m = transformers.BertForSequenceClassification(cfg).eval()
    f = torch.compile(m, backend="eager")
    with gt_core.diagnostics(eager_every=0), torch.no_grad():
        for n in [8] * 6 + [12] * 3:
            f(input_ids=torch.zeros(2, n, dtype=torch.long))
    (u,) = gt_core.report().to_data()["user_compiles"]
    assert u["function"] == "BertForSequenceClassification"
    assert u["compiles"] == 2 and u["calls"]["calls"] == 9
    assert u["calls"]["outcomes"] == {"compiling": 2, "compiled": 7}


def _checked(x):
    if x.sum() > 0:  # (a graph break: the data decides)
        return x * 2
    raise ValueError("negative input")


def test_a_call_an_exception_leaves_counts_as_raised_and_one_made_while_handling_does_not():
    """The user's own error raised inside a compiled function is ``raised`` (not eager, not
    timed); a call that succeeds inside an ``except`` block, where an exception is being
    handled already, is counted by how it ran."""
    f = torch.compile(_checked, backend="eager")
    with gt_core.diagnostics(eager_every=0):
        f(torch.ones(3))
        for _ in range(2):
            try:
                f(-torch.ones(3))
            except ValueError:
                f(torch.ones(3))  # (inside the handler: it ran, compiled)
    c = calls_of("_checked")["calls"]
    assert c["calls"] == 5
    # (the first negative call compiled its raising branch too: raised comes first)
    assert c["outcomes"] == {"compiling": 1, "raised": 2, "compiled": 2}
    assert "raised" not in c["median_ms"]
    assert "2 raised an error" in calls_text(calls_of("_checked"))
