"""One speedup and one break-even per run: the report, the figures, the tables and the bench
all read gt_core.observe.metrics, so they agree for the same events."""

from __future__ import annotations

import random

import pytest

from gt_core.observe import events as ev
from gt_core.observe import metrics
from gt_core.observe.report import summarize
from gt_jupyter import _figures, _render, _tables

SIG = "abc"


def _run(n_eager=6, n_compiled=40, seed=1) -> list[dict]:
    """A hot path's events with noisy timings: a slow warm-up, a compile, a faster tail."""
    rng, t = random.Random(seed), 0.0
    out = [ev.event(ev.STATS, ops=100)]
    for i in range(n_eager):
        t += 1
        out.append(ev.event(ev.ITERATION, signature=SIG, kind="eager", ms=10 + rng.random()))
        out[-1]["t"] = t
        if i == 1:
            out.append({"type": ev.DETECTED, "t": t, "signature": SIG, "ops": [], "n_ops": 0})
            out.append({"type": ev.COMPILE_STARTED, "t": t + 0.1, "signature": SIG})
    out.append({"type": ev.COMPILE_FINISHED, "t": t + 0.5, "signature": SIG, "seconds": 0.03})
    for i in range(n_compiled):
        t += 1
        ms = (9.0 if i < 5 else 4.0) + rng.random()  # warm-up and autotuning, then steady
        out.append({"type": ev.ITERATION, "t": t, "signature": SIG, "kind": "compiled", "ms": ms})
    return out


@pytest.mark.parametrize("since", [0, 12])
def test_report_figure_and_text_table_show_one_speedup_and_one_break_even(since):
    events = _run()
    data = summarize(events, since)
    (p,) = data["hot_paths"]
    td = _figures.timeline_of(data, SIG)
    (row,) = _tables.status_rows(data)
    assert p["speedup"] is not None and p["speedup"] == td["speedup"] == row["speedup"]
    assert p["eager_median_ms"] == td["baseline_ms"]
    assert p["compiled_median_ms"] == td["steady_ms"]
    if since == 0:
        assert p["break_even"] is not None
    assert p["break_even"] == td["break_even"] == row["break_even"]
    text = _render.to_text(data)
    assert f"({p['speedup']:.2f}x)" in text
    if p["break_even"] is not None:
        assert f"break-even at iteration {p['break_even']}" in text
    # The figure's own annotation shows the same number.
    notes = [a["text"] for a in _figures.timeline(td).to_plotly_json()["layout"]["annotations"]]
    assert any(f"steady state {p['speedup']:.2f}x" in s for s in notes)


def test_the_medians_are_the_metrics_definitions():
    events = _run()
    (p,) = summarize(events)["hot_paths"]
    eager = [e["ms"] for e in events if e.get("kind") == "eager"]
    compiled = [e["ms"] for e in events if e.get("kind") == "compiled"]
    assert p["eager_median_ms"] == metrics.eager_median(eager)
    # The steady state: the last third of the compiled runs, past the warm-up.
    assert p["compiled_median_ms"] == metrics.steady(compiled) < 5.0
    assert p["speedup"] == pytest.approx(metrics.eager_median(eager) / metrics.steady(compiled))


def test_the_bench_break_even_is_the_metrics_one():
    from gt_bench import bench  # noqa: PLC0415 (imports torch)

    gt_s = [0.05, 0.02, 0.004, 0.004, 0.004, 0.004, 0.004, 0.004, 0.004, 0.004, 0.004, 0.004]
    # Against 10 ms per eager iteration: after n, gt's total is 62 + 4n ms, below 10n from 11.
    assert bench._break_even(gt_s, 10.0) == 11
    assert bench._break_even(gt_s[:3], 10.0) is None
    assert metrics.speedup(10.0, 4.0) == 2.5 and metrics.speedup(None, 4.0) is None
