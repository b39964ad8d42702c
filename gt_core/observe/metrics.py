"""Metrics: the one definition of a hot path's medians, speedup and break-even.

The report, the dashboard's figures and tables, and the bench all call these, so one run
shows one speedup and one break-even wherever it is shown. Pure functions of plain data:
no torch import.

- eager median: the median of the eager runs alone; runs that shared the CPU with a compile
  are slower and count only when there is nothing else.
- compiled median: the median of the steady state, the last third of the compiled runs (at
  least three): past warm-up and autotuning.
- speedup: eager median / compiled median.
- a reverted hot path: its eager and compiled medians are those the regression check
  compared (the ``revert`` event's), the comparison that decided its state.
- time saved so far: the eager-only estimate minus the time with gt, after the last run
  (negative: lost). With gt: the runs as they ran, plus a compile that held up the loop (an
  inline one; one in the background costs what it slowed the runs beside it). Eager only:
  compiled runs at the eager median, runs beside a compile at the median or as they ran if
  faster (see :func:`break_even`).
- break-even: the first iteration (1-based) from which the time with gt stays below the
  eager-only estimate through the last run; there is one exactly when time was saved.

All are worker times: a block's runs as the worker timed them, not the client's Python.

The data a loop moves (the report's ``data`` entry, :func:`data`): the client's counters of
bytes uploaded and fetched and its ms copying them, per iteration of the step (the hot path
run most: :func:`step`), against the step's ms (:func:`step_ms`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from gt_core.observe import events as ev

__all__ = [
    "median",
    "steady",
    "eager_median",
    "compiled_median",
    "speedup",
    "break_even",
    "runs",
    "judged",
    "timeline",
    "step",
    "step_ms",
    "per_iteration",
    "pace_ms",
    "data",
    "DATA_SHARE",
    "DATA_MIN_BYTES",
]

EAGER, COMPILING, COMPILED = "eager", "compiling", "compiled"  # an iteration's kind


def median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def steady(xs: Sequence[float]) -> float | None:
    """The median of the last third of a series (at least three runs): its steady state."""
    return median(list(xs)[-max(3, len(xs) // 3) :])


MIN_BASELINE = 3  # eager runs a baseline needs: one slow first run must not set it
CLIENT_SAMPLES = 256  # the client's ms of the newest calls of a block kept (for the median)


def eager_median(eager: Sequence[float], compiling: Sequence[float] = ()) -> float | None:
    """The eager baseline: eager runs alone, else runs slowed by a compile (flatters gt);
    None from fewer than MIN_BASELINE runs (two recorded jit calls, say: the first one pays
    for warming up, and the median of two is their mean)."""
    if len(eager) >= MIN_BASELINE:
        return median(eager)
    return median(compiling) if len(compiling) >= MIN_BASELINE else None


def compiled_median(compiled: Sequence[float]) -> float | None:
    return steady(compiled)


def speedup(eager_ms: float | None, compiled_ms: float | None) -> float | None:
    """How many times faster the compiled runs are; None without both medians."""
    return eager_ms / compiled_ms if eager_ms and compiled_ms else None


def break_even(
    kinds: list[str],
    ms: list[float],
    compile_ms: float | None,
    charge_at: int,
    x: list[int] | None = None,
    gaps: list[dict] = (),
    baseline: float | None = None,
) -> dict:
    """Cumulative time with gt against an eager-only estimate, where gt pulls ahead for good,
    and the time saved so far.

    With gt: every run as it ran, plus ``compile_ms`` (a compile that held up the loop) at
    iteration index ``charge_at``. Eager only: each eager run as it ran; each compiled run
    as the eager median (``baseline``; default: :func:`eager_median` of these runs); each run
    beside a compile as the baseline, or as it ran where that was faster (a compile is charged
    the slowdown it caused, never credited with noise). So only compiled runs put gt ahead.

    ``break_even``: the first iteration (1-based) from which gt's total stays below the
    eager-only one through the last run; None if gt is not ahead at the end. ``saved_ms``:
    the eager-only total minus gt's after the last run (negative: time lost). Without a
    baseline every run counts as itself, so only a charged compile shows (as time lost) and
    there is no break-even. So ``saved_ms > 0`` exactly when there is a break-even.

    ``x``: each run's iteration (1-based; default 1..n) when ``gaps`` (folded runs, each
    ``{"at": index of the run after it, "n", "counts", "totals"}``) leave some out; a
    break-even among folded runs is estimated as if their gain came evenly.
    """
    if baseline is None:
        baseline = eager_median(
            [m for k, m in zip(kinds, ms, strict=False) if k == EAGER],
            [m for k, m in zip(kinds, ms, strict=False) if k != COMPILED],
        )
    race = _Race(baseline, compile_ms or 0.0, charge_at)
    at = {g["at"]: g for g in gaps}
    for i in range(len(kinds) + 1):
        if i in at:
            race.fold(at[i])
        if i < len(kinds):
            race.run(kinds[i], ms[i], x[i] if x is not None else i + 1)
    return {
        "baseline_ms": baseline,
        "cum_gt": race.cum_gt,
        "cum_eager": race.cum_eager,
        "break_even": race.ahead,
        "saved_ms": race.eager - race.gt,
    }


class _Race:
    """gt's running total against the eager-only estimate, run by run (see break_even)."""

    def __init__(self, baseline: float | None, charge: float, charge_at: int):
        self.baseline, self.charge, self.charge_at = baseline, charge, charge_at
        self.gt = self.eager = 0.0
        self.cum_gt, self.cum_eager = [], []  # the two totals after each run
        self.ahead: int | None = None  # the iteration since which gt has stayed ahead
        self.done = 0  # iterations counted so far

    def as_eager(self, k: str, m: float) -> float:
        if self.baseline is None or k == EAGER:
            return m
        return self.baseline if k == COMPILED else min(m, self.baseline)

    def run(self, k: str, m: float, x: int) -> None:
        """One run of kind ``k`` that took ``m`` ms, iteration ``x``."""
        self.gt += m + (self.charge if x - 1 == self.charge_at else 0.0)
        self.eager += self.as_eager(k, m)
        self.cum_gt.append(self.gt)
        self.cum_eager.append(self.eager)
        self.done = x
        if self.gt >= self.eager:
            self.ahead = None
        elif self.ahead is None and self.baseline is not None:
            self.ahead = x

    def fold(self, g: dict) -> None:
        """Folded runs: their totals count; a fold keeps totals, so their mean stands in."""
        before = self.gt - self.eager
        totals, counts, done = g.get("totals", {}), g.get("counts", {}), self.done
        charged = done <= self.charge_at < done + g["n"]
        self.gt += sum(totals.values()) + (self.charge if charged else 0.0)
        self.eager += sum(totals.get(k, 0.0) for k in totals if k not in (COMPILED, COMPILING))
        for k in (COMPILED, COMPILING):
            n_k = counts.get(k, 0)
            if n_k:
                self.eager += n_k * self.as_eager(k, totals.get(k, 0.0) / n_k)
        if self.gt >= self.eager:
            self.ahead = None
        elif self.ahead is None and self.baseline is not None:
            share = before / (before - (self.gt - self.eager)) if before > 0 else 0.0
            self.ahead = done + max(1, math.ceil(share * g["n"]))
        self.done += g["n"]


def runs(events: list[dict], signature: str) -> tuple[list[dict], list[dict]]:
    """A hot path's iteration events, and its folds as gaps (see :func:`break_even`)."""
    its, gaps = [], []
    for e in events:
        if e.get("signature") != signature:
            continue
        if e.get("type") == ev.ITERATION:
            its.append(e)
        elif e.get("type") == ev.FOLDED and e.get("of") == ev.ITERATION:
            last = e.get("last", {})
            gaps.append({**e, "at": len(its), "t0": e.get("t"), "t1": last.get("t")})
    return its, gaps


def _positions(its: list[dict], gaps: list[dict]) -> tuple[list[int], int]:
    """Each kept run's iteration (1-based), and the runs in all, folded ones included."""
    x, n = [], 0
    for i in range(len(its)):
        n += sum(g["n"] for g in gaps if g["at"] == i) + 1
        x.append(n)
    return x, n + sum(g["n"] for g in gaps if g["at"] == len(its))


def _first(events: list[dict], type: str, signature: str) -> dict | None:
    return next(
        (e for e in events if e.get("type") == type and e.get("signature") == signature), None
    )


def _before(ts: list, gaps: list[dict], t: float, strict: bool) -> int:
    """Runs that ended before ``t`` (at ``t`` too unless strict); a fold across ``t`` counts
    its runs that come before a compile (eager) or before its end (all but compiled)."""
    n = sum(x < t if strict else x <= t for x in ts)
    for g in gaps:
        t0, t1 = g["t0"], g["t1"]
        if t1 < t or (not strict and t1 == t):
            n += g["n"]
        elif t0 < t or (not strict and t0 == t):
            counts = g.get("counts", {})
            n += counts.get(EAGER, 0) if strict else g["n"] - counts.get(COMPILED, 0)
    return n


def judged(events: list[dict], signature: str) -> dict | None:
    """A hot path's regression check (its ``revert`` or ``hotpath.kept`` event), or None."""
    return next(
        (
            e
            for e in reversed(events)
            if e.get("type") in ev.VERDICTS and e.get("signature") == signature
        ),
        None,
    )


def _blocking(started: dict | None) -> bool:
    """Whether a compile held up the loop (inline); one in the background did not."""
    return started is not None and started.get("where", "inline") == "inline"


def _compile_window(events, signature: str, its: list, gaps: list, x: list, n: int) -> tuple:
    """(started, finished, window, label): a hot path's compile events, the iterations its
    compile spanned ([x0, x1] in half steps; None without one) and what to call it."""
    kinds, ts = [e.get("kind", EAGER) for e in its], [e.get("t") for e in its]
    started = _first(events, ev.COMPILE_STARTED, signature)
    finished = _first(events, ev.COMPILE_FINISHED, signature)
    failed = _first(events, ev.COMPILE_FAILED, signature)
    end = finished or failed
    timed = n > 0 and all(
        isinstance(t, (int, float)) for t in [*ts, *(g[k] for g in gaps for k in ("t0", "t1"))]
    )
    window = None
    if started is not None and timed and isinstance(started.get("t"), (int, float)):
        x0 = _before(ts, gaps, started["t"], strict=True) + 0.5
        x1 = (_before(ts, gaps, end["t"], strict=False) if end and "t" in end else n) + 0.5
        window = [x0, max(x1, x0 + 0.2)]
    elif COMPILING in kinds:
        first = kinds.index(COMPILING)
        last = len(kinds) - 1 - kinds[::-1].index(COMPILING)
        window = [x[first] - 0.5, x[last] + 0.5]
    label = "compile failed" if failed and not finished else ("compiling" if not end else "compile")
    return started, finished, window, label


def timeline(events: list[dict], signature: str, baseline_ms: float | None = None) -> dict:
    """Per-iteration timings of one hot path, its compile window, break-even and speedup.

    ``baseline_ms``: the eager median to measure against (the report's: a cell's view may
    hold no eager run of its own); default: the regression check's (see :func:`judged`), else these
    events' eager runs. Over long runs the log keeps the first and the last iterations one
    by one (see gt_core.observe.events): ``x`` gives each kept one its iteration, totals
    count the folded ones.
    """
    its, gaps = runs(events, signature)
    kinds = [e.get("kind", EAGER) for e in its]
    ms = [float(e.get("ms", 0.0)) for e in its]
    x, n = _positions(its, gaps)
    started, finished, window, label = _compile_window(events, signature, its, gaps, x, n)
    verdict = judged(events, signature)
    revert = verdict if verdict is not None and verdict.get("type") == ev.REVERT else None
    compile_ms = (
        finished["seconds"] * 1000.0 if finished and finished.get("seconds") is not None else None
    )
    if window is not None:
        charge_at = min(int(window[0] - 0.5), max(n - 1, 0))
    else:
        charge_at = x[kinds.index(COMPILED)] - 1 if COMPILED in kinds else n
    if baseline_ms is None and verdict is not None:
        baseline_ms = verdict.get("eager_ms")
    charged = compile_ms if _blocking(started) else None
    be = break_even(kinds, ms, charged, charge_at, x, gaps, baseline_ms)
    base = be["baseline_ms"]
    steady_ms = (
        revert.get("compiled_ms")
        if revert is not None
        else compiled_median([m for k, m in zip(kinds, ms, strict=False) if k == COMPILED])
    )
    return {
        "signature": signature,
        "x": x,
        "kinds": kinds,
        "ms": ms,
        "window": window,
        "window_label": label,
        "compile_ms": compile_ms,
        "compile_charged": charged is not None,  # whether the totals include the compile
        "baseline_ms": base,
        "steady_ms": steady_ms,
        "speedup": speedup(base, steady_ms),
        "cum_gt": be["cum_gt"],
        "cum_eager": be["cum_eager"],
        "break_even": be["break_even"],
        "saved_ms": be["saved_ms"],
        "folded": n - len(its),  # iterations counted in the totals but not drawn one by one
    }


# -- the data a loop moves -------------------------------------------------------------------
# Copies per iteration that take this share of an iteration's time are a reason with a fix,
# where the worker waits between runs by this share of its step (gt_core.observe.feeding): a
# quarter of the loop's time that moving or shrinking the data gives back.
DATA_SHARE = 0.25
# Bytes per iteration below which copies are no reason, whatever their share: a copy of a few
# KB costs microseconds, mostly the call around it, and a tiny step makes any of it a share.
DATA_MIN_BYTES = 64 * 1024


def step(hot_paths: Sequence[dict]) -> dict | None:
    """The step of a view's loop: its hot path run most (the first listed of equals), whose
    runs are the loop's iterations; None without hot paths."""
    return max(hot_paths, key=lambda p: p.get("occurrences", 0), default=None)


def step_ms(path: dict | None) -> float | None:
    """A hot path's ms per iteration, as the report shows it: its compiled median while it
    runs compiled, else its eager median (a reverted one: the check's eager median)."""
    if path is None:
        return None
    compiled = path.get("compiled_median_ms")
    if path.get("status") == COMPILED and compiled is not None:
        return compiled
    return path.get("eager_median_ms")


def per_iteration(total: float, iterations: int) -> float | None:
    """``total`` per iteration; None without iterations."""
    return total / iterations if iterations else None


def pace_ms(events: list[dict], signature: str) -> float | None:
    """The loop's ms per iteration as the worker saw it: from the end of the first to the end
    of the last of a hot path's steady runs (the last third, at least three), over the runs
    between. Its step's ms, plus what the worker did or waited for between runs; None from
    fewer than three timed runs."""
    its, gaps = runs(events, signature)
    x, _ = _positions(its, gaps)
    first = len(its) - max(3, len(its) // 3)
    if first < 0:
        return None
    t0, t1 = its[first].get("t"), its[-1].get("t")
    if not all(isinstance(t, (int, float)) for t in (t0, t1)):
        return None
    return (t1 - t0) * 1000.0 / (x[-1] - x[first])


def data(stats: dict, hot_paths: Sequence[dict], events: Sequence[dict] = ()) -> dict:
    """The data moved in a view and its cost per iteration of the step (:func:`step`).

    ``bytes_up``/``up_ms``: uploads (kernel to worker) and the client's ms copying them in,
    waits for room included; ``bytes_down``/``down_ms``: fetches and its ms copying them out.
    ``iterations``: the step's runs (``signature``); ``ms_per_iter``: both copies per
    iteration; ``share``: that over the step's ms (``step_ms``, :func:`step_ms`);
    ``pace_ms``: the step's :func:`pace_ms` in ``events`` (the view's). Per-iteration
    figures are None without iterations.
    """
    s = step(hot_paths)
    n = s.get("occurrences", 0) if s is not None else 0
    up, down = stats.get("up_ms", 0.0), stats.get("down_ms", 0.0)
    ms = per_iteration(up + down, n)
    sms = step_ms(s)
    return {
        "bytes_up": stats.get("bytes_up", 0),
        "bytes_down": stats.get("bytes_down", 0),
        "up_ms": up,
        "down_ms": down,
        "uploads": stats.get("uploads", 0),
        "fetches": stats.get("fetches", 0),
        "iterations": n,
        "bytes_up_per_iter": per_iteration(stats.get("bytes_up", 0), n),
        "bytes_down_per_iter": per_iteration(stats.get("bytes_down", 0), n),
        "ms_per_iter": ms,
        "signature": s["signature"] if s is not None else None,
        "step_ms": sms,
        "share": ms / sms if ms is not None and sms else None,
        "pace_ms": pace_ms(list(events), s["signature"]) if s is not None else None,
    }
