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
from gt_core.observe import feeding, jit_summary, metrics
from gt_core.observe.causes import explain
from gt_core.observe.rows import NUMERIC, STATUS_COLUMNS, status_rows
from gt_core.observe.status import Status, enter

__all__ = ["Report", "summarize", "status_rows", "Status", "STATUS_COLUMNS", "NUMERIC", "COUNTERS"]


def _new_path(signature: str) -> dict:
    return {
        "signature": signature,
        "status": Status.RECORDING,
        "states": [],  # [state, t]: each state as it was entered (status.enter)
        "options": {},  # what its compile was asked for: backend, mode, dynamic
        "judged": None,  # the regression check's comparison: {"eager_ms", "compiled_ms"}
        "ops": [],
        "n_ops": 0,
        "occurrences": 0,
        "compiled_runs": 0,
        "eager_runs": 0,
        "compile_seconds": None,
        "cudagraphs": None,  # on a GPU with a CUDA-graph mode: "used" or "skipped"
        "cudagraph_skips": [],  # inductor's reasons when skipped
        "cudagraph_explanations": [],  # each reason's {"id", "cause", "fix"} (gt_core.observe.causes)
        "recompile_reasons": [],
        "fallback_reason": None,
        # Its first compiled run against its eager graph: {"ok", "what", "diff", "tolerance"}
        # (or {"skipped": why}); None until a compiled run (gt_core.hotpath.numerics).
        "checked": None,
        "notes": [],  # what some runs did, said once (e.g. run eagerly: inputs shared memory)
        # eager_ms: the baseline; client_ms: the client's ms per occurrence (its Python and
        # recording; for a gt_core.jit step, a replayed call)
        "timings": {"eager_ms": [], "compiled_ms": [], "client_ms": None},
        # Eager runs while a compile shared the worker's CPU: slower, kept out of the baseline.
        "compiling_ms": [],
        "timed_runs": 0,  # runs whose timings the medians read (the rest are folded)
        "mismatches": 0,
        "sync_cuts": 0,  # mismatches where a sync point (or the stream's end) cut a run short
        "detected_at": None,
        "compiled_at": None,
        "jit": None,  # the gt_core.jit function whose calls are this block
        "replayed_runs": 0,  # calls replayed without running the function's Python
        "frozen_scalars": [],  # Python numbers a replay keeps as recorded: {op, arg, value}
        "replay_refused": None,  # why calls are not replayed (the function runs instead)
    }


_SYNC_CUTS = frozenset({"sync point", "end of stream"})


def _check(e: dict) -> dict:
    """A numerical check's outcome as the report keeps it."""
    if e.get("skipped"):
        return {"skipped": e["skipped"]}
    keep = ("what", "diff", "bound")
    return {"ok": e["type"] == ev.CHECKED, **{k: e.get(k) for k in keep}}


_CLIENT = frozenset({ev.JIT, ev.JIT_STATS, ev.CLIENT_STATS})


def _client(e: dict, path, known) -> None:
    """What the client says of a hot path: gt_core.jit's state and counts, its ms."""
    sig = e.get("signature")
    t = e["type"]
    # Counts and timings annotate a hot path the report knows; only jit's own state (its
    # block registered just before) names one it may not have seen yet.
    if sig is None or (sig not in known and not (t == ev.JIT and e.get("state") == "replaying")):
        return
    p = path(sig)
    if t == ev.JIT:
        p["jit"] = e.get("function")
        if e.get("state") == "replaying":
            p["frozen_scalars"], p["replay_refused"] = list(e.get("frozen", [])), None
        elif e.get("state") == "refused":
            p["replay_refused"] = e.get("reason")
    elif t == ev.JIT_STATS:
        p["jit"] = e.get("function")
        p["replayed_runs"] = e.get("replayed", 0)
        if e.get("client_ms") is not None:
            p["timings"]["client_ms"] = e["client_ms"]
    elif p["jit"] is None and e.get("client_ms") is not None:  # CLIENT_STATS
        p["timings"]["client_ms"] = e["client_ms"]


# The client's counters (a ``stats`` event's; gt_core.client.session): cumulative, so a view
# counts from the last ones before it.
COUNTERS = ("ops", "frees", "syncs", "uploads", "fetches")
COUNTERS += ("bytes_up", "up_ms", "bytes_down", "down_ms")  # data moved (metrics.data)
# What happened before a cell still decides a hot path's state; its runs and counters do not.
_RUNS = frozenset({ev.ITERATION, ev.MISMATCH, ev.STATS, ev.FOLDED})


def summarize(events: list[dict], since: int = 0) -> dict:
    """Fold events into the report data: hot paths, user compiles, jit, counters, the events.

    ``since``: the view of one cell, whose events start at that index. Earlier events still
    give each hot path its status, ops and graph; runs, timings, counters and the user's
    compiles count from ``since`` on, and only hot paths active since then are listed.
    """
    paths: dict[str, dict] = {}
    stats = dict.fromkeys(COUNTERS, 0)
    base = dict(stats)  # the counters when the view starts
    worker: dict = {}
    active: set[str] = set()
    earlier: dict[tuple, list[float]] = {}  # (signature, kind) -> eager timings before the view

    def path(sig: str) -> dict:
        if sig not in paths:
            paths[sig] = _new_path(sig)
        return paths[sig]

    for i, e in enumerate(events):
        t = e.get("type")
        sig = e.get("signature")
        if i < since and t in _RUNS:
            if t == ev.FOLDED and e.get("of") == ev.STATS:
                e = e["last"]
                t = ev.STATS
            if t == ev.STATS:
                base.update({k: e[k] for k in base if k in e})
            elif t == ev.ITERATION and e.get("kind") in ("eager", "compiling"):
                earlier.setdefault((sig, e["kind"]), []).append(e["ms"])  # baselines for the view
            continue
        if i >= since and sig is not None:
            active.add(sig)
        if t == ev.STATS and e.get("base"):  # a log's counters when it was opened
            base.update({k: e[k] for k in base if k in e})
            stats.update({k: e[k] for k in stats if k in e})
        elif t == ev.RECORDING:
            p = path(sig)
            if p["status"] == Status.RECORDING:
                p.update(ops=list(e.get("ops", [])), n_ops=e.get("n_ops", 0))
                enter(p["states"], Status.RECORDING, e.get("t"))
        elif t == ev.DETECTED:
            p = path(sig)
            if e.get("recording_t") is not None:
                enter(p["states"], Status.RECORDING, e["recording_t"])
            p.update(status=Status.HOT, ops=list(e.get("ops", [])), n_ops=e.get("n_ops", 0))
            enter(p["states"], Status.HOT, e.get("t"))
            p["detected_at"] = e.get("t")
            if i >= since:  # (its occurrences ran before the view: not the view's runs)
                p["occurrences"] = max(p["occurrences"], e.get("occurrences", 0))
        elif t == ev.COMPILE_STARTED:
            p = path(sig)
            p["status"] = Status.COMPILING
            p["options"] = {k: e[k] for k in ("backend", "mode", "dynamic") if k in e}
            enter(p["states"], Status.COMPILING, e.get("t"))
        elif t == ev.COMPILE_FINISHED:
            p = path(sig)
            enter(p["states"], Status.COMPILED, e.get("t"))
            p.update(
                status=Status.COMPILED,
                compile_seconds=e.get("seconds"),
                compiled_at=e.get("t"),
                cudagraphs=e.get("cudagraphs"),
                cudagraph_skips=list(e.get("cudagraph_skips") or []),
            )
            p["cudagraph_explanations"] = [
                explain("cudagraph_skip", r) for r in p["cudagraph_skips"]
            ]
        elif t in (ev.COMPILE_FAILED, ev.FALLBACK):
            p = path(sig)
            p.update(status=Status.FAILED, fallback_reason=e.get("reason"))
            enter(p["states"], Status.FAILED, e.get("t"))
        elif t in ev.VERDICTS:  # (a kept block's runs go on compiled: their median is shown)
            p = path(sig)
            p["judged"] = {"eager_ms": e.get("eager_ms"), "compiled_ms": e.get("compiled_ms")}
            if t == ev.REVERT:
                p.update(status=Status.REVERTED, fallback_reason=e.get("reason"))
                enter(p["states"], Status.REVERTED, e.get("t"))
        elif t == ev.CHECK_FAILED:
            p = path(sig)
            p.update(status=Status.REVERTED, fallback_reason=e.get("reason"), checked=_check(e))
            enter(p["states"], Status.REVERTED, e.get("t"))
        elif t == ev.CHECKED:
            path(sig)["checked"] = _check(e)
        elif t in (ev.NOTE, ev.CACHE_EVICTED):
            path(sig)["notes"].append(e.get("reason", ""))
        elif t == ev.RECOMPILE:
            path(sig)["recompile_reasons"].append(e.get("reason", ""))
        elif t == ev.MISMATCH:
            if sig not in paths:
                continue  # a block known only before a reset(): nothing to show it against
            p = paths[sig]
            p["mismatches"] += 1
            if e.get("got") in _SYNC_CUTS:
                p["sync_cuts"] += 1
        elif t == ev.ITERATION:
            p = path(sig)
            p["occurrences"] += 1
            p["timed_runs"] += 1
            if e.get("kind") == "compiled":
                p["compiled_runs"] += 1
                p["timings"]["compiled_ms"].append(e["ms"])
            else:
                p["eager_runs"] += 1
                during = e.get("kind") == "compiling"
                (p["compiling_ms"] if during else p["timings"]["eager_ms"]).append(e["ms"])
        elif t == ev.STATS:
            stats.update({k: e[k] for k in stats if k in e})
        elif t in _CLIENT or (t == ev.FOLDED and e.get("of") in _CLIENT):
            _client(e.get("last", e), path, paths)
        elif t == ev.FOLDED:
            if e.get("of") == ev.MISMATCH and sig not in paths:
                continue  # as for a mismatch: a block known only before a reset()
            _fold(e, path, stats)
        elif t == ev.WORKER:
            worker = {k: v for k, v in e.items() if k not in ("type", "t")}
            if e.get("state") == "died":  # its compiles in flight died with it
                for p in paths.values():
                    if p["status"] in (Status.HOT, Status.COMPILING):
                        p.update(
                            status=Status.FAILED,
                            fallback_reason=f"the worker died ({e.get('cause')}) before "
                            "this hot path was compiled",
                        )
                        enter(p["states"], Status.FAILED, e.get("t"))

    hot_paths = [p for p in paths.values() if not since or p["signature"] in active]
    if since:
        stats = {k: max(stats[k] - base[k], 0) if stats[k] else 0 for k in stats}
    elif any(base.values()):  # a log opened mid-session: what it saw
        stats = {k: max(stats[k] - base[k], 0) for k in stats}

    from gt_core.observe.user_compiles import summarize_user_compiles  # noqa: PLC0415 (cycle-free, lazy)

    shown = list(events[since:])
    if since:  # a listed hot path's graph and revert may come from before the view
        shown = [
            e
            for e in events[:since]
            if (e.get("type") == ev.DETECTED or e.get("type") in ev.VERDICTS)
            and e.get("signature") in active
        ] + shown
    jit = jit_summary.summarize_jit(events, since)
    for j in jit:  # the block a jitted function made (its refusal may name no block)
        if j["signature"] in paths:
            p = paths[j["signature"]]
            p["jit"] = j["function"]
            p["replay_refused"] = j["reason"] if j["state"] == "refused" else None
    for p in hot_paths:
        # The baseline: for a judged hot path, the eager median its regression check compared
        # against (metrics.judged: eager runs in the compiled runs' CPU condition); else eager
        # runs alone, else earlier ones, else those slowed by a compile (flagged: a speedup
        # against those flatters the compiled block).
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
    return {
        "hot_paths": hot_paths,
        "user_compiles": summarize_user_compiles(events[since:]),
        "jit": jit,  # per jitted call key, refused before a block too
        "stats": stats,
        "data": metrics.data(stats, hot_paths, shown),  # what crossed, per iteration
        "worker": worker,
        "events": shown,
    }


def _fold(e: dict, path, stats: dict) -> None:
    """Count a fold of per-step events: its runs, its mismatches, its last counters."""
    of, sig = e.get("of"), e.get("signature")
    counts = e.get("counts", {})
    if of == ev.STATS:
        stats.update({k: e["last"][k] for k in stats if k in e["last"]})
    elif of == ev.ITERATION:
        p = path(sig)
        p["occurrences"] += e["n"]
        n = counts.get("compiled", 0)
        p["compiled_runs"] += n
        p["eager_runs"] += e["n"] - n
    elif of == ev.MISMATCH and sig is not None:
        p = path(sig)
        p["mismatches"] += e["n"]
        p["sync_cuts"] += sum(counts.get(g, 0) for g in _SYNC_CUTS)


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
            lines += [f"    note: {r}" for r in p.get("notes", ())]
            for r in p["cudagraph_skips"]:
                lines.append(f"    cudagraphs skipped: {r}")
        lines += ["  " + x for x in jit_summary.lines(d["jit"])]
        for u in d["user_compiles"]:
            lines.append(
                f"  torch.compile {u['function']}: {u['compiles']} compile(s), "
                f"{len(u['recompile_reasons'])} recompile(s), {len(u['graph_breaks'])} graph break(s)"
                + (", recompile limit hit" if u["limit_hit"] else "")
            )
            for x in u["explanations"]:
                lines.append(f"    {x['cause']} -> {x['fix']}")
        return "\n".join(lines + feeding.lines(d["data"]))

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


def _fmt(x: float | None, unit: str) -> str:
    return "-" if x is None else f"{x:.3g} {unit}"


def _path_line(p: dict) -> str:
    speed = f", {p['speedup']:.2f}x" if p.get("speedup") else ""
    return (
        f"{p['signature']} [{p['status']}] {p['n_ops']} ops, {p['occurrences']} runs "
        f"({p['compiled_runs']} compiled, {p['eager_runs']} eager), "
        f"eager {_fmt(p['eager_median_ms'], 'ms')}, compiled {_fmt(p['compiled_median_ms'], 'ms')}{speed}"
    )
