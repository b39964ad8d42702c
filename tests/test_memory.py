"""Bounded memory: the client's log folds per-step events, the report still counts them all.

Synthetic event streams stand in for a worker (millions of steps in seconds); eager runs of
the same stream through an unbounded list are the oracle.
"""

from __future__ import annotations

import random

import pytest

from gt_core import events as ev
from gt_core.observe import metrics
from gt_core.observe.report import summarize
from gt_jupyter import _figures, _render

SIG = "abc123"


def _stream(n: int, sig: str = SIG, t0: float = 1000.0, seed: int = 0) -> list[dict]:
    """A hot path's life: detected, 3 eager runs, a compile over 40 runs, then compiled runs;
    counters every 100 steps and a mismatch every 7th."""
    rng = random.Random(seed)
    t = t0
    out = [{"type": ev.DETECTED, "t": t, "signature": sig, "ops": ["mm"], "n_ops": 1}]
    for i in range(n):
        t += 0.001
        if i == 3:
            out.append({"type": ev.COMPILE_STARTED, "t": t, "signature": sig})
        if i == 43:
            out.append({"type": ev.COMPILE_FINISHED, "t": t, "signature": sig, "seconds": 0.04})
        kind = "eager" if i < 3 else "compiling" if i < 43 else "compiled"
        ms = 1.0 + rng.random() * 0.1 if kind != "compiled" else 0.5 + rng.random() * 0.05
        out.append({"type": ev.ITERATION, "t": t, "signature": sig, "kind": kind, "ms": ms})
        if i % 100 == 0:
            out.append(
                {"type": ev.STATS, "t": t, "ops": 10 * i, "frees": i, "syncs": 0, "uploads": 1}
            )
        if i % 7 == 0:
            got = "sync point" if i % 14 else "aten.add"
            out.append({"type": ev.MISMATCH, "t": t, "signature": sig, "got": got, "position": 2})
    return out


def _logged(events: list[dict], **bound) -> ev.EventLog:
    log = ev.EventLog(**bound)
    log.extend(events)
    return log


def test_under_the_bound_the_log_keeps_every_event_and_summaries_are_the_same():
    events = _stream(900)
    log = _logged(events, head=500, tail=500)
    assert log.snapshot() == events and len(log) == len(events)
    assert summarize(log.snapshot()) == summarize(events)
    data = summarize(log.snapshot())
    assert _render.to_text(data) == _render.to_text(summarize(events))
    assert _figures.timeline_data(data["events"], SIG) == _figures.timeline_data(events, SIG)


def test_millions_of_steps_stay_bounded_and_counts_are_exact():
    head, tail = 50, 50
    log = ev.EventLog(head=head, tail=tail)
    n, total = 2_000_000, 0.0
    e = {"type": ev.ITERATION, "t": 1.0, "signature": SIG, "kind": "compiled", "ms": 0.25}
    other = {"type": ev.ITERATION, "t": 1.0, "signature": "other", "kind": "eager", "ms": 2.0}
    batch = [e] * 999 + [other]
    for _ in range(n // len(batch)):
        log.extend(batch)
        total += 999 * 0.25
    kept = log.snapshot()
    # Per series: the head, the tail, one fold.
    assert len(kept) == 2 * (head + tail + 1)
    assert len(log) == n
    (p, q) = summarize(kept)["hot_paths"]
    assert (p["occurrences"], p["compiled_runs"], p["timed_runs"]) == (n * 999 // 1000,) * 2 + (
        head + tail,
    )
    assert q["occurrences"] == q["eager_runs"] == n // 1000
    (fold,) = [f for f in kept if f["type"] == ev.FOLDED and f["signature"] == SIG]
    assert fold["n"] == n * 999 // 1000 - head - tail
    assert fold["totals"]["compiled"] == pytest.approx(total - (head + tail) * 0.25)


def test_over_the_bound_counts_totals_and_time_saved_match_the_full_stream():
    events = _stream(20_000)
    full, folded = summarize(events), summarize(_logged(events, head=200, tail=300).snapshot())
    (p,), (q,) = full["hot_paths"], folded["hot_paths"]
    for key in ("occurrences", "compiled_runs", "eager_runs", "mismatches", "sync_cuts"):
        assert q[key] == p[key], key
    assert folded["stats"] == full["stats"]
    assert q["timed_runs"] == 500 and p["timed_runs"] == 20_000
    # The eager baseline is in the head; the medians of the kept compiled runs are close.
    assert q["eager_median_ms"] == p["eager_median_ms"]
    assert q["compiled_median_ms"] == pytest.approx(p["compiled_median_ms"], rel=0.02)
    assert q["saved_ms"] == pytest.approx(p["saved_ms"], rel=0.01)


def test_the_timeline_of_a_folded_run_places_the_kept_runs_and_counts_the_rest():
    events = _stream(20_000)
    full = _figures.timeline_data(events, SIG)
    td = _figures.timeline_data(
        summarize(_logged(events, head=200, tail=300).snapshot())["events"], SIG
    )
    assert td["x"][:200] == list(range(1, 201)) and td["x"][-300:] == list(range(19_701, 20_001))
    assert td["folded"] == 19_500
    assert td["window"] == full["window"] and td["break_even"] == full["break_even"]
    assert td["cum_gt"][-1] == pytest.approx(full["cum_gt"][-1])
    assert td["cum_eager"][-1] == pytest.approx(full["cum_eager"][-1])
    assert "not drawn" in _figures.timeline(td).layout.title.text


def test_a_break_even_among_folded_runs_is_estimated_within_them():
    # Compiled runs gain 0.5 ms each against a 1 ms baseline; the compile costs 1 s: the
    # 2001st compiled run pulls ahead, deep inside the fold.
    kinds = ["eager"] * 2 + ["compiled"] * 10 + ["compiled"] * 10
    x = [1, 2, *range(3, 13), *range(4991, 5001)]
    gap = {"at": 12, "n": 4978, "counts": {"compiled": 4978}, "totals": {"compiled": 2489.0}}
    be = metrics.break_even(kinds, [1.0] * 2 + [0.5] * 20, 1000.0, 2, x, [gap], baseline=1.0)
    exact = metrics.break_even(
        ["eager"] * 2 + ["compiled"] * 4998, [1.0] * 2 + [0.5] * 4998, 1000.0, 2, baseline=1.0
    )
    assert abs(be["break_even"] - exact["break_even"]) <= 1


def test_a_cell_view_never_shares_a_fold_with_the_cells_before():
    log = ev.EventLog(head=10, tail=10)
    first = _stream(500)
    log.extend(first)
    start = log.mark()
    second = _stream(700, t0=2000.0, seed=1)[1:]  # the same hot path, not detected again
    log.extend(second)
    events, since = log.view(start)
    cell = summarize(events, since=since)
    (p,) = cell["hot_paths"]
    assert p["occurrences"] == 700 and p["mismatches"] == 100
    assert cell["stats"]["ops"] == 10 * 600 - 10 * 400  # counters since the last before the cell
    assert summarize(events)["hot_paths"][0]["occurrences"] == 1200


def test_stats_folds_keep_the_latest_counters():
    log = ev.EventLog(head=2, tail=2)
    for i in range(1000):
        log.emit(ev.STATS, ops=i, frees=0, syncs=0, uploads=0)
    assert len(log.snapshot()) == 5
    assert summarize(log.snapshot())["stats"]["ops"] == 999


def test_clear_forgets_folds_and_counts():
    log = _logged(_stream(3000), head=10, tail=10)
    log.clear()
    assert len(log) == 0 and log.snapshot() == []
    log.extend(_stream(5))
    assert summarize(log.snapshot())["hot_paths"][0]["occurrences"] == 5
