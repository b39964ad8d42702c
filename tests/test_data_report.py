"""Feeding data: what crossed between the kernel and the worker, per iteration of the step.

The report's ``data`` entry folds the client's counters (bytes up and down, the client's ms
copying them) as it folds the others: a cell counts from the counters before it, folds count
their last. Per iteration means per run of the step, the hot path run most. One line says it;
a reason says when the copies take a large share of each iteration while the worker waits,
with a fix that is tested here to do what it says.
"""

from __future__ import annotations

import pytest
import torch
from conftest import moved

import gt_core
from gt_core.observe import events as ev
from gt_core.observe import feeding, metrics
from gt_core.observe.report import COUNTERS, Report, summarize
from gt_jupyter import _render, _tables
from gt_jupyter._bundles import nbytes
from gt_jupyter.dashboard import EMPTY, Dashboard
from gt_jupyter.views import StatusView

SIG = "abc"
KEYS = {
    "bytes_up",
    "bytes_down",
    "up_ms",
    "down_ms",
    "uploads",
    "fetches",
    "iterations",
    "bytes_up_per_iter",
    "bytes_down_per_iter",
    "ms_per_iter",
}


def _stats(t: float, **counters) -> dict:
    return {"type": ev.STATS, "t": t, **dict.fromkeys(COUNTERS, 0), **counters}


def _loop(n: int, ms: float = 1.0, kind: str = "eager", sig: str = SIG, t0: float = 1.0,
          every: float = 1.0):  # fmt: skip
    """A hot path detected after 2 occurrences, then ``n`` runs of ``ms`` each, one ending
    every ``every`` seconds (a second: the worker mostly waits between them)."""
    detected = {"type": ev.DETECTED, "t": t0, "signature": sig, "ops": [], "n_ops": 0}
    out = [{**detected, "occurrences": 2}]
    for i in range(n):
        run = {"type": ev.ITERATION, "t": t0 + (i + 1) * every, "signature": sig, "kind": kind}
        out.append({**run, "ms": ms})
    return out


# -- the numbers -----------------------------------------------------------------------------
def test_the_data_entry_is_the_counters_per_run_of_the_step():
    events = [
        _stats(0.0),
        *_loop(8),  # 2 occurrences at detection + 8 runs: 10 iterations
        *_loop(3, sig="other", t0=20.0),  # a second, smaller hot path: not the step
        _stats(
            30.0, uploads=20, bytes_up=2_007_040, up_ms=3.0, fetches=10, bytes_down=40, down_ms=1.0
        ),  # fmt: skip
    ]
    d = summarize(events)["data"]
    assert KEYS <= set(d)
    assert {k: d[k] for k in KEYS} == {
        "bytes_up": 2_007_040,
        "bytes_down": 40,
        "up_ms": 3.0,
        "down_ms": 1.0,
        "uploads": 20,
        "fetches": 10,
        "iterations": 10,
        "bytes_up_per_iter": 200_704.0,
        "bytes_down_per_iter": 4.0,
        "ms_per_iter": 0.4,
    }
    assert d["signature"] == SIG and d["step_ms"] == 1.0 and d["share"] == 0.4


def test_a_cell_counts_from_the_counters_before_it_and_only_its_own_runs():
    before = [_stats(0.0), *_loop(6), _stats(10.0, bytes_up=1000, up_ms=1.0, uploads=5)]
    cell = [
        *_loop(4, t0=11.0)[1:],  # the same hot path, not detected again: 4 runs
        _stats(
            20.0,
            bytes_up=1000 + 4 * 512,
            up_ms=1.5,
            uploads=9,
            bytes_down=80,
            down_ms=0.25,
            fetches=4,
        ),  # fmt: skip
    ]
    d = summarize(before + cell, since=len(before))["data"]
    assert (d["iterations"], d["bytes_up"], d["uploads"], d["fetches"]) == (4, 2048, 4, 4)
    assert (d["bytes_up_per_iter"], d["bytes_down_per_iter"]) == (512.0, 20.0)
    assert d["up_ms"] == 0.5 and d["ms_per_iter"] == (0.5 + 0.25) / 4
    whole = summarize(before + cell)["data"]  # 2 at detection, 6 + 4 runs
    assert whole["iterations"] == 12 and whole["bytes_up_per_iter"] == (1000 + 2048) / 12


def test_a_log_opened_mid_session_counts_what_it_saw():
    base = {**_stats(0.0, bytes_up=10_000, up_ms=2.0, uploads=3), "base": True}
    d = summarize([base, *_loop(4), _stats(9.0, bytes_up=10_000 + 6 * 100, up_ms=2.6, uploads=9)])
    assert d["data"]["bytes_up"] == 600 and d["data"]["iterations"] == 6
    assert d["data"]["bytes_up_per_iter"] == 100.0 and d["data"]["uploads"] == 6
    assert d["data"]["up_ms"] == pytest.approx(0.6)


def test_folded_events_count_as_the_events_they_fold():
    events = [_stats(0.0)]
    for i in range(1, 301):  # stats after every run: the log folds both series
        events += _loop(1, t0=float(i))[1:] if i > 1 else _loop(1)
        events.append(_stats(i + 0.5, bytes_up=256 * i, up_ms=0.01 * i, uploads=i, fetches=i,
                             bytes_down=4 * i, down_ms=0.001 * i))  # fmt: skip
    log = ev.EventLog(head=10, tail=10)
    log.extend(events)
    folded = log.snapshot()
    assert any(e["type"] == ev.FOLDED and e["of"] == ev.STATS for e in folded)
    d, full = summarize(folded)["data"], summarize(events)["data"]
    assert d == full
    assert d["iterations"] == 302  # 2 at detection, 300 runs
    assert (d["bytes_up_per_iter"], d["bytes_down_per_iter"]) == (256 * 300 / 302, 4 * 300 / 302)
    # a cell whose stats were folded: its base is the fold's last counters before it
    start = log.mark()
    log.extend(_loop(5, t0=400.0)[1:] + [_stats(500.0, bytes_up=256 * 300 + 5 * 1000, uploads=305)])
    cell = summarize(*log.view(start))["data"]
    assert (cell["iterations"], cell["bytes_up_per_iter"], cell["uploads"]) == (5, 1000.0, 5)


def test_without_iterations_the_per_iteration_figures_are_null():
    d = summarize([_stats(0.0), _stats(1.0, bytes_up=5000, up_ms=0.5, uploads=2)])["data"]
    assert d["iterations"] == 0 and d["bytes_up"] == 5000
    assert d["bytes_up_per_iter"] is d["bytes_down_per_iter"] is d["ms_per_iter"] is None
    assert d["share"] is None and feeding.reasons(d) == []
    assert feeding.line(d) == "data: 5.0 KB in, 0 B out (0.5 ms copying; no iterations counted yet)"
    assert EMPTY["data"]["iterations"] == 0 and feeding.line(EMPTY["data"]) is None


def test_the_step_time_is_the_median_the_report_shows_for_the_step():
    eager = {"status": "hot", "eager_median_ms": 2.0, "compiled_median_ms": None}
    assert metrics.step_ms(eager) == 2.0
    compiled = {"status": "compiled", "eager_median_ms": 2.0, "compiled_median_ms": 0.5}
    assert metrics.step_ms(compiled) == 0.5
    reverted = {"status": "reverted", "eager_median_ms": 2.0, "compiled_median_ms": 3.0}
    assert metrics.step_ms(reverted) == 2.0 and metrics.step_ms(None) is None
    paths = [{"signature": "a", "occurrences": 3}, {"signature": "b", "occurrences": 7}]
    assert metrics.step(paths)["signature"] == "b" and metrics.step([]) is None
    # the report's own hot path: a compiled one's ms per iteration is its compiled median
    events = [_stats(0.0), *_loop(3, 2.0), *_loop(6, 0.5, "compiled", t0=4.0)[1:]]
    events.insert(5, {"type": ev.COMPILE_FINISHED, "t": 3.5, "signature": SIG, "seconds": 0.1})
    events.insert(5, moved(SIG, "compiled", 3.5, was="compiling"))
    data = summarize(events)
    (p,) = data["hot_paths"]
    assert data["data"]["step_ms"] == p["compiled_median_ms"] == 0.5


# -- the line --------------------------------------------------------------------------------
PACE = 1000 * 2**-9  # ms: an iteration every 1.953125 ms (exact in binary), its step 1 ms


def _fed(up_ms: float, down_ms: float = 0.0, bytes_up: int = 200_704, bytes_down: int = 4,
         n: int = 10, pace: float = PACE) -> dict:  # fmt: skip
    """Report data of ``n`` iterations of an eager step of 1 ms, one every ``pace`` ms, with
    these counters per iteration."""
    events = [_stats(0.0), *_loop(n - 2, 1.0, every=pace / 1000)]
    events.append(_stats(99.0, uploads=n, bytes_up=bytes_up * n, up_ms=up_ms * n, fetches=n,
                         bytes_down=bytes_down * n, down_ms=down_ms * n))  # fmt: skip
    return summarize(events)


def test_one_line_says_what_crossed_per_iteration_wherever_the_counters_show():
    data = _fed(up_ms=0.03, down_ms=0.01)
    line = "data: 200.7 KB in, 4 B out per iteration (0.04 ms copying, 4% of the step)"
    assert feeding.line(data["data"]) == line
    events = [_stats(0.0), *_loop(8), _stats(99.0, uploads=10, bytes_up=2_007_040, up_ms=0.3,
                                            fetches=10, bytes_down=40, down_ms=0.1)]  # fmt: skip
    report = Report(events)
    assert line in str(report).splitlines() and line in report._repr_html_()
    assert _render.to_text(data).splitlines()[1] == line and line in _render.to_html(data)
    dash = Dashboard(data, mode="notebook")
    head = dash.bundles(live=True)["headline"]
    assert head["text/plain"].splitlines() == [_render.headline(data), line]
    assert line in head["text/html"]
    assert line not in dash.bundles(live=True)["tables"]["text/plain"]  # said once
    view = StatusView({"started": False}, data)
    assert line in view.lines() and line in view._repr_html_()


def test_nothing_moved_no_line():
    data = summarize([_stats(0.0), *_loop(8), _stats(9.0, ops=100, uploads=3)])  # 0-d: no bytes
    assert feeding.line(data["data"]) is None
    assert "data:" not in str(Report(data["events"])) and "data:" not in _render.to_text(data)
    head = Dashboard(data, mode="notebook").bundles(live=True)["headline"]
    assert "data:" not in head["text/plain"] and "data:" not in head["text/html"]


def test_the_line_costs_the_live_dashboard_a_few_bytes_per_update():
    data = _fed(up_ms=0.03, down_ms=0.01)
    dash = Dashboard(data, mode="notebook")
    with_line = sum(nbytes(b) for b in dash.bundles(live=True).values())
    dash.data = {**data, "data": EMPTY["data"]}
    assert with_line - sum(nbytes(b) for b in dash.bundles(live=True).values()) < 300


# -- the reasons -----------------------------------------------------------------------------
def test_the_pace_is_the_steady_runs_time_apart_folded_runs_counted():
    assert _fed(up_ms=0.0)["data"]["pace_ms"] == PACE
    assert metrics.pace_ms(_loop(30, every=0.002), SIG) == pytest.approx(2.0)
    assert metrics.pace_ms(_loop(2), SIG) is None  # two runs: no pace
    log = ev.EventLog(head=5, tail=2)
    log.extend(_loop(100, every=0.002))  # 93 folded between the last 3 kept: counted
    assert metrics.pace_ms(log.snapshot(), SIG) == pytest.approx(2.0)


def test_uploads_that_take_a_quarter_of_each_iteration_are_a_reason_with_its_fix():
    at = metrics.DATA_SHARE * PACE  # 0.488 ms, under the step's 1 ms
    below = _fed(up_ms=at * 0.99)
    assert feeding.reasons(below["data"]) == []
    assert not [r for r in _tables.reason_rows(below) if r["kind"] == "uploads"]
    data = _fed(up_ms=at)
    (x,) = feeding.reasons(data["data"])
    assert x["kind"] == "uploads" and x["id"] == "feeding"
    assert x["cause"] == (
        "feeding data takes 25% of this loop's time: 200.7 KB uploaded per iteration take "
        "0.488 ms of each iteration's 1.95 ms (the step: 1 ms)"
    )
    assert "gt_core.to_worker(X)" in x["fix"] and ".split(b)" in x["fix"]
    (row,) = [r for r in _tables.reason_rows(data) if r["kind"] == "uploads"]
    assert (row["where"], row["reason"], row["what to do"]) == (SIG, x["cause"], x["fix"])
    assert f"{x['cause']} -> {x['fix']}" in str(Report(data["events"]))
    assert x["fix"] in _render.to_text(data) and "uploads" in _render.tables_html(data)
    # as long as the step or longer: the worker would wait for the copies alone
    (x,) = feeding.reasons(_fed(up_ms=1.0)["data"])
    assert x["cause"].startswith("feeding data bounds this loop: 200.7 KB uploaded per iteration")


def test_copies_are_no_reason_where_the_worker_never_waits():
    # The client's upload ms include its waits for room in the ring: a loop bound by the
    # worker's compute makes them as long as a step, with its runs back to back.
    busy = _fed(up_ms=1.0, down_ms=1.0, bytes_down=1_048_576, pace=1 + 0.99 * metrics.DATA_SHARE)
    assert busy["data"]["share"] == 2.0 and feeding.reasons(busy["data"]) == []
    waits = _fed(up_ms=1.0, pace=1 + 1.01 * metrics.DATA_SHARE)
    assert [x["kind"] for x in feeding.reasons(waits["data"])] == ["uploads"]


def test_small_copies_are_no_reason_whatever_their_share():
    small = _fed(up_ms=1.0, down_ms=1.0, bytes_up=metrics.DATA_MIN_BYTES - 1,
                 bytes_down=metrics.DATA_MIN_BYTES - 1)  # fmt: skip
    assert feeding.reasons(small["data"]) == []
    assert len(feeding.reasons(_fed(up_ms=1.0, bytes_up=metrics.DATA_MIN_BYTES)["data"])) == 1


def test_a_sync_that_fetches_a_lot_each_iteration_is_a_reason_with_its_fix():
    at = metrics.DATA_SHARE * PACE
    assert feeding.reasons(_fed(0.0, down_ms=at * 0.99, bytes_down=1_048_576)["data"]) == []
    data = _fed(0.0, down_ms=0.75, bytes_down=1_048_576)
    (x,) = feeding.reasons(data["data"])
    assert x["kind"] == "fetches" and x["cause"] == (
        "fetching data takes 38% of this loop's time: syncs fetch 1.0 MB per iteration, copied "
        "out in 0.75 ms of each iteration's 1.95 ms (the step: 1 ms) while the worker waits"
    )
    assert "fetch less often (every k steps)" in x["fix"] and "an argmax" in x["fix"]
    (row,) = [r for r in _tables.reason_rows(data) if r["kind"] == "fetches"]
    assert row["reason"] == x["cause"]


# -- end to end ------------------------------------------------------------------------------
def _cell(run) -> Report:
    """The report of what ``run()`` does, counted from the counters before it."""
    gt_core.report()  # publishes the counters so far: the view starts after them
    start = gt_core.events_log().mark()
    run()
    gt_core.wait()  # the worker's events so far (its runs) are in the log
    return gt_core.report(since=start)


def _step(w, acc):
    def step(x):
        y = torch.tanh(x * w)  # x, a plain tensor, is uploaded here: once
        acc.mul_(0.5).add_(y).add_(y.square()).sub_(y.mean())

    return step


def test_a_batch_uploaded_each_step_is_its_bytes_per_iteration(inprocess):
    gt_core.configure(auto_compile=True, background=False)
    X = torch.randn(60 * 16, 8)  # host data (made outside the capture): each batch is uploaded
    batch = X[:16].numel() * X.element_size()
    with gt_core.capture():
        step = _step(torch.randn(16, 8), torch.zeros(16, 8))
        for i in range(20):  # detected and compiled here
            step(X[i * 16 : (i + 1) * 16])
        gt_core.wait(compiles=True, timeout=60)
        report = _cell(lambda: [step(X[i * 16 : (i + 1) * 16]) for i in range(20, 60)])
    data = report.to_data()
    (p,) = data["hot_paths"]
    d = data["data"]
    assert p["status"] == "compiled" and d["iterations"] == p["occurrences"] == 40
    assert (d["uploads"], d["bytes_up"], d["bytes_up_per_iter"]) == (40, 40 * batch, batch)
    assert (d["fetches"], d["bytes_down_per_iter"]) == (0, 0.0)
    assert d["ms_per_iter"] == d["up_ms"] / 40 > 0
    assert f"data: {feeding.size(batch)} in, 0 B out per iteration" in str(report)


def test_the_fix_for_uploads_keeps_the_batches_on_the_worker_and_the_loop_compiled(inprocess):
    gt_core.configure(auto_compile=True, background=False)
    X = torch.randn(20 * 16, 8)
    with gt_core.capture():
        step = _step(torch.randn(16, 8), torch.zeros(16, 8))
        Xw = gt_core.to_worker(X)  # the fix: the dataset moves once
        # What the fix warns of: slicing the worker's dataset anew each step finds no hot path.
        # (Shown first: once the fix's loop has compiled the step, the sliced steps follow its
        # plan too, a slice being a batch like any other.)
        data = _cell(lambda: [step(Xw[i * 16 : (i + 1) * 16]) for i in range(20)]).to_data()
        assert data["hot_paths"] == [] and data["data"]["iterations"] == 0
        gt_core.reset()

        def epochs():
            for _ in range(3):
                perm = torch.randperm(len(Xw))
                for x in Xw[perm].split(16):
                    step(x)

        data = _cell(epochs).to_data()
        d = data["data"]
        (p,) = data["hot_paths"]
        assert p["status"] == "compiled" and d["iterations"] == p["occurrences"] >= 50
        assert d["bytes_up"] == d["bytes_up_per_iter"] == 0  # batches are views, not uploads


def test_a_fetch_each_step_is_its_bytes_per_iteration_and_the_fix_fetches_less(inprocess):
    gt_core.configure(auto_compile=True, background=False)
    with gt_core.capture():
        acc = torch.zeros(64, 32)
        step = _step(torch.randn(64, 32), acc)
        x = torch.randn(64, 32)
        size = acc.numel() * acc.element_size()
        kept = []

        def fetching(every: int, value):
            def run():
                for i in range(30):
                    step(x)
                    if i % every == every - 1:
                        kept.append(value().cpu())

            return run

        fetching(1, lambda: acc)()  # detected and compiled here
        data = _cell(fetching(1, lambda: acc)).to_data()
        d = data["data"]
        assert data["hot_paths"] and d["iterations"] == 30
        assert (d["fetches"], d["bytes_down_per_iter"]) == (30, size)
        # the fix: fetch less often, or less
        for every, value, per_iter in ((5, lambda: acc, size / 5), (1, acc.sum, 4)):
            gt_core.reset()
            fetching(every, value)()
            data = _cell(fetching(every, value)).to_data()
            assert data["hot_paths"] and data["data"]["bytes_down_per_iter"] == per_iter, every


class _Rows(torch.utils.data.Dataset):
    """A map-style dataset of one's own: a row at a time."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def test_batches_built_on_the_worker_row_by_row_are_a_reason_and_its_fix_is_one_op(inprocess):
    """A dataset of one's own over worker tensors builds each batch op by op (a select per
    row, another number every step): a reason once per dataset class, with its fix; the fix,
    a TensorDataset of the same tensors, builds a batch in one op per tensor, no reason."""
    from torch.utils.data import DataLoader, TensorDataset

    def loop(make, epochs=2):
        g = torch.Generator().manual_seed(0)
        for _ in range(epochs):
            for x, y in DataLoader(make(X, Y), batch_size=8, shuffle=True, generator=g):
                (x.sum() + y.sum()).item()

    with gt_core.capture() as s:
        X, Y = torch.randn(32, 4), torch.randn(32)
        loop(_Rows)
        d = gt_core.report().to_data()["data"]
        assert d["rows"] == [{"dataset": "_Rows", "rows": 8, "ops": 8 * 2 + 2, "draws": 0}]
        (why,) = [r for r in feeding.reasons(d) if r["kind"] == "rows"]
        assert why["id"] == "rows" and "TensorDataset" in why["fix"]
        assert "_Rows's batches are built on the worker op by op" in str(gt_core.report())
        gt_core.reset()
        ops = s.counters["ops"]
        loop(TensorDataset)
        assert s.counters["ops"] - ops < 2 * 4 * 8  # (row by row: 18 ops a batch)
        assert gt_core.report().to_data()["data"]["rows"] == []


class _Noisy(torch.utils.data.Dataset):
    """Host rows augmented with draws from the global generator in ``__getitem__``."""

    def __init__(self, x, generator=None):
        self.x, self.generator = x, generator

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(self.x.shape[1:], generator=self.generator)


def test_rows_drawing_from_the_global_generator_are_a_reason_and_its_fix_keeps_eagers_values(
    inprocess,
):
    """Rows drawn from the global generator are made on the worker (eager's stream is
    there), the batch op by op: a reason of its own, whose fix (a generator the dataset holds)
    builds a host batch with no op, and draws as eager does."""
    from torch.utils.data import DataLoader

    x = torch.randn(16, 3)
    with gt_core.capture() as s:
        for _ in DataLoader(_Noisy(x), batch_size=8):
            pass
        (why,) = [r for r in feeding.reasons(gt_core.report().to_data()["data"])]
        assert why["id"] == "rows-draw" and "8 draws for a batch of 8 rows" in why["cause"]
        assert "generator=self.g" in why["fix"]
        gt_core.reset()
        batches = iter(DataLoader(_Noisy(x, torch.Generator().manual_seed(1)), batch_size=8))
        ops = s.counters["ops"]
        got = list(batches)
        assert s.counters["ops"] == ops and gt_core.report().to_data()["data"]["rows"] == []
    want = list(DataLoader(_Noisy(x, torch.Generator().manual_seed(1)), batch_size=8))
    assert all(
        type(g) is torch.Tensor and torch.equal(g, w) for g, w in zip(got, want, strict=True)
    )
