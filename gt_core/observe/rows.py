"""The status table's rows: one per hot path, read from the report's plain data.

Shown by ``Report._repr_html_`` and by gt_jupyter's tables alike.
"""

from __future__ import annotations

from gt_core.observe.status import Status

__all__ = ["STATUS_COLUMNS", "NUMERIC", "status_rows", "settling"]


# The status table, one row per hot path: (row key, header), here and in gt_jupyter's tables.
STATUS_COLUMNS = (
    ("signature", "signature"),
    ("status", "status"),
    ("settled", "settled"),
    ("ops", "ops"),
    ("runs", "runs"),
    ("compile_s", "compile s"),
    ("recompiles", "recompiles"),
    ("eager_ms", "eager ms"),
    ("compiled_ms", "compiled ms"),
    ("speedup", "speedup"),
)
# Columns of numbers (right-aligned where shown; text columns are left-aligned).
NUMERIC = frozenset(
    {"ops", "runs", "compile_s", "recompiles", "eager_ms", "compiled_ms", "speedup"}
    | {"client_ms", "replayed", "break_even", "compiles", "graph breaks", "cudagraph skips"}
)


def status_rows(data: dict) -> list[dict]:
    """One row per hot path: its status, size, runs, compile time, recompiles and timings."""
    return [
        {
            "signature": p["signature"],
            "status": p["status"],
            "settled": settling(p),
            "ops": p.get("n_ops", 0),
            "runs": p.get("occurrences", 0),
            "compile_s": p.get("compile_seconds"),
            "recompiles": len(p.get("recompile_reasons", [])),
            "eager_ms": p.get("eager_median_ms"),
            # Only runs slowed by a compile were timed eagerly: the speedup is flattered.
            "eager_note": " (while compiling)" if p.get("baseline_while_compiling") else "",
            "compiled_ms": p.get("compiled_median_ms"),
            "speedup": p.get("speedup"),
            "break_even": p.get("break_even"),
            "saved_ms": p.get("saved_ms"),
            "states": p.get("states", []),
            "cudagraphs": p.get("cudagraphs"),  # None unless asked for on a GPU
            "replayed": p.get("replayed_runs", 0),  # gt_core.jit calls replayed
            "client_ms": (p.get("timings") or {}).get("client_ms"),
        }
        for p in data.get("hot_paths", [])
    ]


def settling(p: dict) -> str:
    """Where a hot path's compiled block is between its compile and its speed from then on:
    ``checking`` (its first run against eager), ``timing`` (the judge's runs against eager),
    ``after N runs`` (a verdict: kept compiled, or back to eager), ``-`` (nothing compiled)."""
    settled = p.get("settled")
    if settled is not None:
        runs = settled.get("runs")
        return "yes" if runs is None else f"after {runs} run{'s' if runs != 1 else ''}"
    if p["status"] != Status.COMPILED:
        return "-"
    return "checking" if p.get("checked") is None else "timing"
