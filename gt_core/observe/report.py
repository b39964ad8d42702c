"""Reports: the events of a session folded into plain data, with text and HTML views.

``summarize(events)`` is a pure function of the event list, so a live session, a saved
instruction log and the dashboard all read the same data. No torch import here.

Over long runs the client's log folds per-step events (``folded``, see gt_core.observe.events): run
counts, mismatch counts and the time saved still count every run; the medians (eager,
compiled, speedup: gt_core.observe.metrics) are over the runs kept, the first and the last of each hot path.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from gt_core.observe import events as ev
from gt_core.observe import explore, feeding, jit_summary, metrics, ranks
from gt_core.observe.fold import COUNTERS, Fold
from gt_core.observe.rows import NUMERIC, STATUS_COLUMNS, status_rows
from gt_core.observe.status import Status

__all__ = ["Report", "summarize", "status_rows", "Status", "STATUS_COLUMNS", "NUMERIC", "COUNTERS"]


def summarize(events: list[dict], since: int = 0) -> dict:
    """Fold events into the report data: hot paths, user compiles, jit, counters, the events.

    ``since``: the view of one cell, whose events start at that index. Earlier events still
    give each hot path its status, ops and graph; runs, timings, counters and the user's
    compiles count from ``since`` on, and only hot paths active since then are listed.
    """
    fold = Fold(since)
    for i, e in enumerate(events):
        fold.feed(i, e)
    paths, stats, base = fold.paths, fold.stats, fold.base
    hot_paths = [p for p in paths.values() if not since or p["signature"] in fold.active]
    if since:
        stats = {k: max(stats[k] - base[k], 0) if stats[k] else 0 for k in stats}
    elif any(base.values()):  # a log opened mid-session: what it saw
        stats = {k: max(stats[k] - base[k], 0) for k in stats}

    from gt_core.observe.user_compiles import summarize_user_compiles  # noqa: PLC0415 (cycle-free, lazy)

    shown = _shown(events, since, fold.active)
    explore.annotate(hot_paths, events)  # its form with lines, code and compile phases
    jit = jit_summary.summarize_jit(events, since)
    for j in jit:  # the block a jitted function made (its refusal may name no block)
        if j["signature"] in paths:
            p = paths[j["signature"]]
            p["jit"] = j["function"]
            p["replay_refused"] = j["reason"] if j["state"] == "refused" else None
    for p in hot_paths:
        _add_timeline(p, shown, fold.earlier)
    return {
        "hot_paths": hot_paths,
        "user_compiles": summarize_user_compiles(events[since:]),
        "jit": jit,  # per jitted call key, refused before a block too
        "stats": stats,
        # what crossed, per iteration, and the DataLoaders that built batches row by row
        "data": {**metrics.data(stats, hot_paths, shown), "rows": feeding.rows(shown)},
        "worker": fold.worker,
        "ranks": ranks.summarize_ranks(events),  # a worker group's (gt_core.observe.ranks)
        "lines": explore.client_lines(events, since),  # syncs and uploads per user line
        "events": shown,
    }


def _shown(events: list[dict], since: int, active: set) -> list[dict]:
    """The view's events, after a listed hot path's graph and revert from before it."""
    shown = list(events[since:])
    if since:
        shown = [
            e
            for e in events[:since]
            if (e.get("type") in ev.FORMS or e.get("type") in ev.VERDICTS)
            and e.get("signature") in active
        ] + shown
    return shown


def _add_timeline(p: dict, shown: list[dict], earlier: dict) -> None:
    """A hot path's medians, speedup, time saved and break-even, from one timeline.

    The baseline: for a judged hot path, the eager median its regression check compared
    against (metrics.judged: eager runs in the compiled runs' CPU condition); else eager runs
    alone, else earlier ones, else those slowed by a compile (flagged: a speedup against
    those flatters the compiled block)."""
    sig = p["signature"]
    clean = p["timings"]["eager_ms"] or earlier.get((sig, "eager"))
    p["baseline_while_compiling"] = not clean and not p["judged"]
    baseline = metrics.eager_median(
        clean or [], p["compiling_ms"] or earlier.get((sig, "compiling"), [])
    )
    if p["judged"]:
        baseline = p["judged"]["eager_ms"]
    # Every number shown comes from this one timeline (gt_core.observe.metrics).
    td = metrics.timeline(shown, sig, baseline)
    p["eager_median_ms"] = td["baseline_ms"]
    p["compiled_median_ms"] = td["steady_ms"]
    p["speedup"] = td["speedup"]
    p["saved_ms"] = td["saved_ms"] or 0.0
    p["break_even"] = td["break_even"]


@dataclass
class Report:
    """What gt saw: hot paths, their compile status and timings, the user's compiles."""

    events: list[dict] = field(default_factory=list)
    since: int = 0  # the view's first event (an index in ``events``), as in summarize()

    def to_data(self) -> dict:
        return summarize(self.events, self.since)

    def __str__(self) -> str:
        d = self.to_data()
        s = d["stats"]
        lines = [
            f"gt report: {s['ops']} ops recorded, {len(d['hot_paths'])} hot path(s), "
            f"{sum(p['status'] == Status.COMPILED for p in d['hot_paths'])} compiled"
            + (f", {jit_summary.counts(d['jit'])}" if d["jit"] else "")
        ]
        for p in d["hot_paths"]:
            lines.append("  " + _path_line(p))
            for r in p["recompile_reasons"]:
                lines.append(f"    recompile: {r}")
            if p["fallback_reason"]:
                lines.append(f"    {p['status']}: {p['fallback_reason']}")
            if p.get("retired"):
                lines.append(f"    retired: {p['retired']['reason']}")
            lines += [f"    note: {r}" for r in p.get("notes", ())]
            for r in p["cudagraph_skips"]:
                lines.append(f"    cudagraphs skipped: {r}")
        lines += ["  " + x for x in jit_summary.lines(d["jit"])]
        from gt_core.observe.user_compiles import (  # noqa: PLC0415 (cycle-free, lazy)
            breaks_text,
            calls_text,
            compiling_text,
        )

        for u in d["user_compiles"]:
            split = ", ".join(
                f"{k.removesuffix('_s')} {v:.2f} s" for k, v in u["time_split"].items() if v
            )
            lines.append(
                f"  torch.compile {u['function']}: {u['compiles']} compile(s) in "
                f"{u['compile_seconds']:.2f} s{f' ({split})' if split else ''}, "
                f"{len(u['recompile_reasons'])} recompile(s), {len(u['graph_breaks'])} graph break(s)"
                + (", recompile limit hit" if u["limit_hit"] else "")
            )
            if u["backward_compiles"]:
                lines.append(
                    f"    {u['backward_compiles']} backward compile(s) in "
                    f"{u['backward_seconds']:.2f} s (AOT autograd, at a first backward)"
                )
            for text in (compiling_text(u), calls_text(u), *breaks_text(u)):
                if text:
                    lines.append(f"    {text}")
            for r in u["recompiles"]:
                lines += _recompile_lines(r)
            for x in u["explanations"]:
                lines.append(f"    {x['cause']} -> {x['fix']}")
        return "\n".join(lines + feeding.lines(d["data"]) + ranks.lines(d.get("ranks", [])))

    def _repr_html_(self) -> str:
        d = self.to_data()
        rows = status_rows(d)
        cells = {"compile_s": "s", "eager_ms": "ms", "compiled_ms": "ms", "speedup": "x"}

        def cell(tag: str, key: str, text) -> str:
            side = "right" if key in NUMERIC else "left"
            return (
                f'<{tag} style="text-align:{side}" align="{side}">{html.escape(str(text))}</{tag}>'
            )

        head = "".join(cell("th", k, h) for k, h in STATUS_COLUMNS)
        body = "".join(
            "<tr>"
            + "".join(
                cell("td", k, _fmt(r[k], cells[k]) if k in cells else r[k])
                for k, _ in STATUS_COLUMNS
            )
            + "</tr>"
            for r in rows
        )
        return (
            f"<div class='gt-report'><b>gt report</b>: {d['stats']['ops']} ops recorded"
            f"<table><tr>{head}</tr>{body}</table>"
            f"<pre>{html.escape(str(self))}</pre></div>"
        )


def _recompile_lines(r: dict) -> list[str]:
    """A recompile's every cause, under the user's line that called the compiled function."""
    from gt_core.observe.guard_causes import cause_lines  # noqa: PLC0415 (cycle-free, lazy)

    causes = cause_lines(r)
    if not causes:
        return []
    call = (r["causes"][0].get("line"), r["causes"][0].get("code"))
    at = f" at {call[0]}: {call[1]}" if call[0] and call[1] else f" at {call[0]}" if call[0] else ""
    return [f"    recompile {r['compile_id']}{at}:", *(f"      {c}" for c in causes)]


def _fmt(x: float | None, unit: str) -> str:
    return "-" if x is None else f"{x:.3g} {unit}"


# A compile's cache use (the compile.finished event's ``cache``), as the report says it.
COMPILE_CACHE = {
    "kept": "its artifact kept by gt",
    "hit": "inductor's cache warm",
    "miss": "inductor's cache cold",
    "bypass": "inductor's cache bypassed",
}


def _path_line(p: dict) -> str:
    speed = f", {p['speedup']:.2f}x" if p.get("speedup") else ""
    return (
        f"{p['signature']} [{p['status']}] {p['n_ops']} ops, {p['occurrences']} runs "
        f"({p['compiled_runs']} compiled, {p['eager_runs']} eager), "
        f"eager {_fmt(p['eager_median_ms'], 'ms')}, compiled {_fmt(p['compiled_median_ms'], 'ms')}{speed}"
        f"{_compile_took(p)}"
    )


def _compile_took(p: dict) -> str:
    """How long its compile took and where it came from (nothing before it finished)."""
    s = p.get("compile_seconds")
    if s is None:
        return ""
    cache = COMPILE_CACHE.get(p.get("compile_cache"))
    return f"; compile {s:.2f} s" + (f" ({cache})" if cache else "")
