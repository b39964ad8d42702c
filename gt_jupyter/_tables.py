"""Tables of the report as rows: compile status, reasons with what to do, a summary.

Input is the plain dict of ``gt_core.observe.report.summarize``; _render.py shows the rows as text
and static HTML. No torch import here.
"""

from __future__ import annotations

from gt_core.observe import events as ev
from gt_core.observe import feeding
from gt_core.observe.causes import explain, explain_change
from gt_core.observe.report import NUMERIC, STATUS_COLUMNS, status_rows
from gt_core.observe.status import Status

__all__ = [
    "NUMERIC",
    "STATUS_COLUMNS",
    "REASON_COLUMNS",
    "USER_COLUMNS",
    "primary",
    "reason_rows",
    "recompile_advice",
    "status_rows",
    "summary",
    "user_rows",
]

REASON_COLUMNS = ("where", "kind", "reason", "what to do")
USER_COLUMNS = (
    "function",
    "compiles",
    "compile s",
    "recompiles",
    "graph breaks",
    "limit hit",
    "cudagraph skips",
    "calls",
    "compiled calls",
    "eager calls",
    "vs eager",
)


# -- rows ------------------------------------------------------------------------------------
def recompile_advice(change: dict | None, options: dict | None = None) -> str:
    """What usually fixes a recompile of a hot path, from the typed difference between the
    two signatures (``observe.graph.Change``'s data); ``options``: the hot path's compile
    options (never suggested again)."""
    x = explain_change(change, options)
    return x["fix"] if x["id"] == "unknown" else f"{x['cause']}: {x['fix']}"


def _advice(kind: str, options: dict | None = None) -> str:
    """The catalogue's advice for one kind of gt's own reasons (gt_core.observe.causes),
    fitted to the hot path's compile ``options``."""
    return explain(kind, "", options)["fix"]


def _status_rows(p: dict, failure: dict) -> list[dict]:
    """Why a hot path does not run compiled (reverted, retired, failed), with what to do."""
    sig, options, status = p["signature"], p.get("options"), p.get("status")
    if status == Status.REVERTED:
        kind, advice, reason = "revert", "revert", p.get("fallback_reason") or "slower than eager"
    elif status == Status.RETIRED:
        kind = advice = "retired"
        reason = (p.get("retired") or {}).get("reason") or "matched no more"
    elif status == Status.FAILED:
        kind, advice = failure.get(sig, "compile failed"), "compile_failed"
        reason = p.get("fallback_reason") or "unknown"
    else:
        return []
    return [{"where": sig, "kind": kind, "reason": reason, "what to do": _advice(advice, options)}]


def _path_reason_rows(p: dict, failure: dict) -> list[dict]:
    sig, options = p["signature"], p.get("options")
    reasons = p.get("recompile_reasons", [])
    changes = p.get("recompile_changes") or [None] * len(reasons)
    rows = [
        {"where": sig, "kind": "recompile", "reason": r, "what to do": recompile_advice(c, options)}
        for r, c in zip(reasons, changes, strict=True)
    ]
    rows += _status_rows(p, failure)
    for r, why in zip(
        p.get("cudagraph_skips", []), p.get("cudagraph_explanations", []), strict=True
    ):
        rows.append(
            {"where": sig, "kind": "cudagraphs skipped", "reason": r, "what to do": why["fix"]}
        )
    rows += _would_save_rows(p)
    cuts = p.get("sync_cuts", 0)
    diverged = p.get("mismatches", 0) - cuts
    if diverged:
        rows.append(
            {
                "where": sig,
                "kind": "mismatch",
                "reason": f"{diverged} occurrence(s) diverged",
                "what to do": _advice("mismatch"),
            }
        )
    if cuts:
        rows.append(
            {
                "where": sig,
                "kind": "sync",
                "reason": f"{cuts} occurrence(s) cut short by a sync point (.item(), print, .cpu())",
                "what to do": _advice("sync"),
            }
        )
    return rows


def _jit_rows(j: dict) -> list[dict]:
    """gt_core.jit, per call key (the report's ``jit``): why it is not replayed, with the
    catalogue's fix for that reason, or what a replay keeps frozen."""
    where = f"{j.get('function')} ({j['signature']})" if j.get("signature") else j.get("function")
    if j.get("reason") and j.get("state") in ("refused", "re-recording"):
        x = j.get("explanation") or {}
        return [
            {
                "where": where,
                "kind": f"jit {j['state']}",
                "reason": j["reason"],
                "what to do": x.get("fix") or _advice(f"jit_{j['state']}"),
            }
        ]
    frozen = j.get("frozen") or []
    if j.get("state") != "replaying" or not frozen:
        return []
    kept = ", ".join(f"{f['value']!r} at {f['op']} {f['arg']}" for f in frozen[:6])
    more = f" and {len(frozen) - 6} more" if len(frozen) > 6 else ""
    return [
        {
            "where": where,
            "kind": "jit frozen",
            "reason": f"replayed with these Python numbers as recorded: {kept}{more}",
            "what to do": _advice("jit_frozen"),
        }
    ]


def _would_save_rows(p: dict) -> list[dict]:
    """A plain hot path whose step's Python costs more than its block: what jit would save
    (not for a retired one: the longer hot path that runs it says so, if it applies)."""
    sig, rows = p["signature"], []
    if p.get("status") == Status.RETIRED:
        return rows
    client = (p.get("timings") or {}).get("client_ms")
    block = p.get("compiled_median_ms") or p.get("eager_median_ms")
    if p.get("jit") is None and client and block and client > block:
        rows.append(
            {
                "where": sig,
                "kind": "jit would save",
                "reason": f"the step's Python takes {client:.3f} ms per occurrence on the client, "
                f"its block {block:.3f} ms on the worker",
                "what to do": _advice("jit_would_save"),
            }
        )
    return rows


def _user_reason_rows(u: dict) -> list[dict]:
    fn = f"torch.compile {u.get('function', '?')}"
    rows = [
        {
            "where": fn,
            "kind": x.get("kind", "explanation").replace("_", " "),
            "reason": x.get("cause", "")
            + (f" (at {x['where']})" if x.get("where") else "")
            + (f" ×{x['count']}" if x.get("count", 1) > 1 else ""),
            "what to do": x.get("fix", ""),
        }
        for x in u.get("explanations", [])
    ]
    if rows:
        return rows
    # No explanations folded in: list the raw diagnostics with the general fixes.
    for r in u.get("recompile_reasons", []):
        rows.append(
            {
                "where": fn,
                "kind": "recompile",
                "reason": str(r),
                "what to do": explain("recompile", str(r))["fix"],
            }
        )
    for b in u.get("graph_breaks", []):
        where = f" at {b['where']}" if b.get("where") else ""
        rows.append(
            {
                "where": fn,
                "kind": "graph break",
                "reason": f"{b.get('reason', '')}{where}",
                "what to do": "rewrite that line without the unsupported call, or move it out of the compiled function",
            }
        )
    if u.get("limit_hit"):
        rows.append(
            {
                "where": fn,
                "kind": "recompile limit",
                "reason": "the recompile limit was hit; later calls run eagerly",
                "what to do": "remove the cause of the recompiles above, or mark the changing dimension dynamic",
            }
        )
    for s in u.get("cudagraph_skips", []):
        rows.append(
            {
                "where": fn,
                "kind": "cudagraph skip",
                "reason": str(s),
                "what to do": "avoid mutating inputs in the compiled function (return new tensors instead)",
            }
        )
    return rows


def reason_rows(data: dict) -> list[dict]:
    """Recompiles, fallbacks, reverts, mismatches, jit refusals and the user's compile
    diagnostics, each with a fix."""
    failure = {
        e.get("signature"): (
            "compiled run failed" if e.get("type") == ev.FALLBACK else "compile failed"
        )
        for e in data.get("events", [])
        if e.get("type") in (ev.FALLBACK, ev.COMPILE_FAILED)
    }
    rows = [r for p in data.get("hot_paths", []) for r in _path_reason_rows(p, failure)]
    rows += [r for j in data.get("jit", []) for r in _jit_rows(j)]
    rows += _data_rows(data.get("data"))
    rows += [r for u in data.get("user_compiles", []) for r in _user_reason_rows(u)]
    return rows + [_error_row(e) for e in data.get("events", []) if e.get("type") == ev.ERROR]


def _data_rows(d: dict | None) -> list[dict]:
    """Copies of uploads or fetches that weigh on the loop (gt_core.observe.feeding)."""
    return [
        {
            "where": d.get("signature") or "the loop",
            "kind": x["kind"],
            "reason": x["cause"],
            "what to do": x["fix"],
        }
        for x in feeding.reasons(d)
    ]


def _error_row(e: dict) -> dict:
    notes = [n for n in e.get("notes", []) if n.startswith("(gt worker: raised by")]
    return {
        "where": e.get("where") or "the worker",
        "kind": "worker error",
        "reason": f"{e.get('error')}: {e.get('message')}" + (f" {notes[0]}" if notes else ""),
        "what to do": _advice("worker_error"),
    }


def user_rows(data: dict) -> list[dict]:
    """One row per function the user compiled with torch.compile inside the cell."""
    return [
        {
            "function": u.get("function", "?"),
            "compiles": u.get("compiles", 0),
            "compile s": round(u.get("compile_seconds") or 0.0, 2),
            "recompiles": len(u.get("recompile_reasons", [])),
            "graph breaks": len(u.get("graph_breaks", [])),
            "limit hit": bool(u.get("limit_hit")),
            "cudagraph skips": len(u.get("cudagraph_skips", [])),
            **_call_columns(u.get("calls") or {}),
        }
        for u in data.get("user_compiles", [])
    ]


def _call_columns(c: dict) -> dict:
    """A function's calls in the table: how many, how many ran compiled or eagerly, and the
    compiled calls against eager on the same inputs ("-": not measured)."""
    outcomes = c.get("outcomes") or {}
    eager = sum(outcomes.get(o, 0) for o in ("eager", "partly_eager", "eager_sample"))
    speedup = c.get("speedup")
    return {
        "calls": c.get("calls", 0),
        "compiled calls": outcomes.get("compiled", 0),
        "eager calls": eager,
        "vs eager": f"{speedup:.2f}x" if speedup else "-",
    }


def summary(data: dict) -> dict:
    """Counters for the headline: ops, hot paths by status, time saved so far."""
    paths = data.get("hot_paths", [])
    by = {
        str(s): sum(p["status"] == s for p in paths)
        for s in (
            Status.COMPILED,
            Status.COMPILING,
            Status.FAILED,
            Status.REVERTED,
            Status.RETIRED,
        )
    }
    return {
        "ops": data.get("stats", {}).get("ops", 0),
        "hot_paths": len(paths),
        **by,
        "iterations": sum(p.get("occurrences", 0) for p in paths),
        "saved_ms": sum(p.get("saved_ms") or 0.0 for p in paths),
        "user_compiles": len(data.get("user_compiles", [])),
        "worker": data.get("worker", {}),
    }


def primary(data: dict) -> str | None:
    """The hot path to show first: the one detected last (else the one run most)."""
    paths = data.get("hot_paths", [])
    if not paths:
        return None
    detected = [p for p in paths if p.get("detected_at") is not None]
    if detected:
        return max(detected, key=lambda p: p["detected_at"])["signature"]
    return max(paths, key=lambda p: p.get("occurrences", 0))["signature"]
