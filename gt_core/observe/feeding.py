"""Feeding data: the report's ``data`` entry as a line of text, and its reasons with fixes.

The numbers are gt_core.observe.metrics' (:func:`~gt_core.observe.metrics.data`); this module
words them, for the report, the dashboard and ``%gt status`` alike. No torch import.

- The line: ``data: 200.7 KB in, 4 B out per iteration (0.04 ms copying, 3% of the step)``,
  when anything moved; none when nothing did.
- The reasons: uploads (kind ``uploads``) or fetches (kind ``fetches``) of at least
  ``DATA_MIN_BYTES`` per iteration whose copies take ``DATA_SHARE`` of each iteration's time
  (the loop's pace, metrics.pace_ms) or more, while the worker waits between runs (its pace
  is over the step's ms by ``DATA_SHARE`` of it). Without that wait the loop is bound by the
  worker's compute, and the client's upload ms are its waits for room in the upload ring. A
  fetch's copy runs while the worker waits, so it always adds to the pace.
- Copies as long as the step or longer bound the loop: with nothing else in the kernel the
  worker would still wait for them.
- A DataLoader whose batches were built on the worker op by op (kind ``rows``: a dataset of
  worker tensors indexed a row at a time; the client says so once per dataset class) is a
  reason whatever the pace: each such step runs op by op.
"""

from __future__ import annotations

from gt_core.observe import events as ev
from gt_core.observe import metrics
from gt_core.observe.causes import explain, explain_id

__all__ = ["line", "lines", "reasons", "rows", "size", "KINDS"]

KINDS = ("uploads", "fetches")  # the copies' reasons' kinds (causes.HOTPATH_KINDS, with "rows")


def size(n: float) -> str:
    """Bytes in decimal units: ``4 B``, ``200.7 KB``, ``1.6 MB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.3g} B"


def _ms(ms: float) -> str:
    return f"{ms / 1000:.3g} s" if abs(ms) >= 1000 else f"{ms:.3g} ms"


def _share(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 else "<1%"


def rows(events) -> list[dict]:
    """The DataLoaders whose batches were built on the worker op by op: {dataset, rows, ops,
    draws} each, from their ``data.rows`` events."""
    keys = ("dataset", "rows", "ops", "draws")
    return [{k: e.get(k) for k in keys} for e in events if e.get("type") == ev.DATA_ROWS]


def line(d: dict | None) -> str | None:
    """One line of what crossed between the kernel and the worker; None if nothing did."""
    if not d or not (d.get("bytes_up") or d.get("bytes_down")):
        return None
    if d.get("ms_per_iter") is None:  # no hot path yet: the totals
        total = d.get("up_ms", 0.0) + d.get("down_ms", 0.0)
        return (
            f"data: {size(d['bytes_up'])} in, {size(d['bytes_down'])} out "
            f"({_ms(total)} copying; no iterations counted yet)"
        )
    share = "" if d.get("share") is None else f", {_share(d['share'])} of the step"
    return (
        f"data: {size(d['bytes_up_per_iter'])} in, {size(d['bytes_down_per_iter'])} out "
        f"per iteration ({_ms(d['ms_per_iter'])} copying{share})"
    )


def reasons(d: dict | None) -> list[dict]:
    """``{"id", "kind", "cause", "fix"}`` for each direction whose copies weigh on the loop
    (see the module's docstring); [] when none does or a number is missing."""
    d = d or {}
    rows = [{**explain_id(_rows_why(r), **r), "kind": "rows"} for r in d.get("rows") or ()]
    return rows + _copies(d)


def _copies(d: dict) -> list[dict]:
    """The reasons of the uploads and fetches whose copies weigh on the loop."""
    step, pace, n = d.get("step_ms"), d.get("pace_ms"), d.get("iterations")
    if not step or not pace or not n or pace - step < metrics.DATA_SHARE * step:
        return []  # no step, no pace, or a worker that never waits: not fed too slowly
    out = []
    sides = zip(KINDS, ("bytes_up", "bytes_down"), ("up_ms", "down_ms"), strict=True)
    for kind, nbytes, ms in sides:
        per = metrics.per_iteration(d.get(nbytes, 0), n)
        copy = metrics.per_iteration(d.get(ms, 0.0), n)
        if per < metrics.DATA_MIN_BYTES or copy < metrics.DATA_SHARE * pace:
            continue
        share = _share(copy / pace)
        what = "bounds this loop" if copy >= step else f"takes {share} of this loop's time"
        x = explain(kind, "", what=what, bytes=size(per), ms=_ms(copy), pace=_ms(pace),
                    step=_ms(step))  # fmt: skip
        out.append({**x, "kind": kind})
    return out


def lines(d: dict | None) -> list[str]:
    """The line (if anything moved), then each reason with its fix (the report's text)."""
    head, why = line(d), [f"  {r['cause']} -> {r['fix']}" for r in reasons(d)]
    if head is None and not why:
        return []
    return [head or "data: nothing moved between the kernel and the worker", *why]


def _rows_why(r: dict) -> str:
    """Why a batch was built op by op, as the cause's id: "rows-draw" where its rows draw
    from the global generator (a draw a row or more), else "rows" (they are worker tensors)."""
    return "rows-draw" if (r.get("draws") or 0) >= (r.get("rows") or 1) else "rows"
