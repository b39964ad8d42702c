"""Metrics: the one definition of a hot path's medians, speedup and break-even.

The report, the dashboard's figures and tables, and the bench all call these, so one run
shows one speedup and one break-even wherever it is shown. Pure functions of plain data:
no torch import.

- eager median: the median of the eager runs alone; runs that shared the CPU with a compile
  are slower and count only when there is nothing else.
- compiled median: the median of the steady state, the last third of the compiled runs (at
  least three): past warm-up and autotuning.
- speedup: eager median / compiled median.
- break-even: the first iteration (1-based) where the total time with gt, compile included,
  is below the eager-only estimate (each compiled run replaced by the eager median).
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
    "timeline",
]

EAGER, COMPILING, COMPILED = "eager", "compiling", "compiled"  # an iteration's kind


def median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def steady(xs: Sequence[float]) -> float | None:
    """The median of the last third of a series (at least three runs): its steady state."""
    return median(list(xs)[-max(3, len(xs) // 3) :])


def eager_median(eager: Sequence[float], compiling: Sequence[float] = ()) -> float | None:
    """The eager baseline: eager runs alone, else runs slowed by a compile (flatters gt)."""
    return median(eager or compiling)


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
    """Cumulative time with gt against an eager-only estimate, and where gt pulls ahead.

    With gt: every iteration as it ran, plus ``compile_ms`` charged at iteration index
    ``charge_at``. Eager only: eager iterations as they ran, each compiled one replaced by
    the eager median (``baseline``; default: :func:`eager_median` of these runs). None if
    gt never pulls ahead, or there is no baseline.

    ``x``: each run's iteration (1-based; default 1..n) when ``gaps`` (folded runs, each
    ``{"at": index of the run after it, "n", "counts", "totals"}``) leave some out; a
    break-even among folded runs is estimated as if their gain came evenly.
    """
    x = x if x is not None else list(range(1, len(kinds) + 1))
    if baseline is None:
        baseline = eager_median(
            [m for k, m in zip(kinds, ms, strict=False) if k == EAGER],
            [m for k, m in zip(kinds, ms, strict=False) if k != COMPILED],
        )
    cum_gt, cum_eager = [], []
    gt = eager = 0.0
    found = None
    at = {g["at"]: g for g in gaps}
    done = 0  # iterations counted so far
    for i in range(len(kinds) + 1):
        g = at.get(i)
        if g is not None:
            before = gt - eager
            totals, n_comp = g.get("totals", {}), g.get("counts", {}).get(COMPILED, 0)
            gt += sum(totals.values())
            gt += (compile_ms or 0.0) if done <= charge_at < done + g["n"] else 0.0
            eager += sum(v for k, v in totals.items() if k != COMPILED)
            eager += baseline * n_comp if baseline is not None else totals.get(COMPILED, 0.0)
            if found is None and baseline is not None and n_comp and gt < eager:
                share = before / (before - (gt - eager)) if before > 0 else 0.0
                found = done + max(1, math.ceil(share * g["n"]))
            done += g["n"]
        if i == len(kinds):
            break
        k, m = kinds[i], ms[i]
        gt += m + ((compile_ms or 0.0) if x[i] - 1 == charge_at else 0.0)
        eager += baseline if (k == COMPILED and baseline is not None) else m
        cum_gt.append(gt)
        cum_eager.append(eager)
        done = x[i]
        if found is None and baseline is not None and k == COMPILED and gt < eager:
            found = x[i]
    return {"baseline_ms": baseline, "cum_gt": cum_gt, "cum_eager": cum_eager, "break_even": found}


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


def timeline(events: list[dict], signature: str, baseline_ms: float | None = None) -> dict:
    """Per-iteration timings of one hot path, its compile window, break-even and speedup.

    ``baseline_ms``: the eager median to measure against (the report's: a cell's view may
    hold no eager run of its own); default: these events' eager runs. Over long runs the log
    keeps the first and the last iterations one by one (see gt_core.observe.events): ``x``
    gives each kept one its iteration, totals count the folded ones.
    """
    its, gaps = runs(events, signature)
    kinds = [e.get("kind", EAGER) for e in its]
    ms = [float(e.get("ms", 0.0)) for e in its]
    ts = [e.get("t") for e in its]
    x, n = [], 0
    for i in range(len(its)):
        n += sum(g["n"] for g in gaps if g["at"] == i) + 1
        x.append(n)
    n += sum(g["n"] for g in gaps if g["at"] == len(its))
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

    compile_ms = (
        finished["seconds"] * 1000.0 if finished and finished.get("seconds") is not None else None
    )
    if window is not None:
        charge_at = min(int(window[0] - 0.5), max(n - 1, 0))
    else:
        charge_at = x[kinds.index(COMPILED)] - 1 if COMPILED in kinds else n
    be = break_even(kinds, ms, compile_ms, charge_at, x, gaps, baseline_ms)
    base = be["baseline_ms"]
    steady_ms = compiled_median([m for k, m in zip(kinds, ms, strict=False) if k == COMPILED])
    return {
        "signature": signature,
        "x": x,
        "kinds": kinds,
        "ms": ms,
        "window": window,
        "window_label": label,
        "compile_ms": compile_ms,
        "baseline_ms": base,
        "steady_ms": steady_ms,
        "speedup": speedup(base, steady_ms),
        "cum_gt": be["cum_gt"],
        "cum_eager": be["cum_eager"],
        "break_even": be["break_even"],
        "folded": n - len(its),  # iterations counted in the totals but not drawn one by one
    }
