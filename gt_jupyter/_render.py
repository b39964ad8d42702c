"""The report as plain text and as static HTML: a headline, the tables, the figures as SVG.

Input is the plain dict of ``gt_core.observe.report.summarize``; the rows come from _tables.py, the
figures from _figures.py and _graphs.py, drawn as inline SVG by _svg.py. No torch import here.
"""

from __future__ import annotations

import html

from gt_core.observe import feeding, ranks
from gt_core.observe.jit_summary import counts as jit_counts
from gt_core.observe.rows import settling
from gt_core.observe.status import Status, sequence
from gt_core.observe.user_compiles import breaks_text, calls_text, compiling_text

from . import _bundles, _figures, _graphs
from ._svg_marks import title_of
from ._tables import (
    NUMERIC,
    REASON_COLUMNS,
    STATUS_COLUMNS,
    USER_COLUMNS,
    primary,
    reason_rows,
    status_rows,
    summary,
    user_rows,
)

__all__ = [
    "STYLE",
    "data_html",
    "data_line",
    "figure_html",
    "figures_html",
    "headline",
    "state",
    "reasons_html",
    "table",
    "states_html",
    "status_html",
    "tables_html",
    "to_html",
    "to_text",
]


# -- text ------------------------------------------------------------------------------------
def _fmt(x, unit: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.3g}{unit}"
    return f"{x}{unit}"


def _settled_words(settled: str) -> str:
    """A status row's ``settled`` after its status: ``, settled after 11 runs``, ``, timing``,
    or nothing (nothing compiled)."""
    if settled == "-":
        return ""
    if settled in ("checking", "timing"):
        return f", {settled}"
    return ", settled" if settled == "yes" else f", settled {settled}"


def _ms(ms: float) -> str:
    return f"{ms / 1000:.3g} s" if abs(ms) >= 1000 else f"{ms:.3g} ms"


def state(data: dict) -> str:
    """The state now: the shown hot path's (see _tables.primary), else ``recording``; a
    compiled one not settled yet says what it waits for (``compiled, timing``)."""
    sig = primary(data)
    path = next((p for p in data.get("hot_paths", []) if p["signature"] == sig), None)
    if path is None:
        return str(Status.RECORDING)
    settled = settling(path)
    waits = path["status"] == Status.COMPILED and settled in ("checking", "timing")
    return f"{path['status']}, {settled}" if waits else str(path["status"])


def headline(data: dict) -> str:
    """One line: the state now, then what gt did in this cell."""
    s = summary(data)
    parts = [
        f"{state(data)} · {s['ops']} ops recorded",
        f"{s['hot_paths']} hot path{'s' if s['hot_paths'] != 1 else ''}",
    ]
    states = [
        f"{s[k]} {k}"
        for k in (Status.COMPILED, Status.COMPILING, Status.FAILED, Status.REVERTED, Status.RETIRED)
        if s[k]
    ]
    if states:
        parts[-1] += f" ({', '.join(states)})"
    if s["saved_ms"]:
        parts.append(
            f"saved {_ms(s['saved_ms'])} so far"
            if s["saved_ms"] > 0
            else f"lost {_ms(-s['saved_ms'])} so far"
        )
    if s["user_compiles"]:
        parts.append(f"{s['user_compiles']} torch.compile function(s)")
    if data.get("jit"):  # a refusal may come before any hot path: said here all the same
        parts.append(jit_counts(data["jit"]))
    if not s["ops"] and not s["hot_paths"] and s["user_compiles"]:
        parts = parts[2:]  # (a cell of torch.compile alone, --local: nothing was recorded)
    busy = [compiling_text(u) for u in data.get("user_compiles", []) if u.get("compiling")]
    return "gt: " + ", ".join(busy + parts)


def data_line(data: dict) -> str:
    """What crossed between the kernel and the worker per iteration ('' if nothing did)."""
    return feeding.line(data.get("data")) or ""


def to_text(data: dict, head: bool = True) -> str:
    """A plain-text summary: headline and data line (unless not ``head``), one line per hot
    path, reasons with what to do."""
    lines = [x for x in (headline(data), data_line(data)) if x] if head else []
    for r in status_rows(data):
        line = (
            f"  {r['signature']} [{r['status']}{_settled_words(r['settled'])}] {r['ops']} ops, {r['runs']} runs, "
            f"compile {_fmt(r['compile_s'], ' s')}, eager {_fmt(r['eager_ms'], ' ms')}{r['eager_note']} → "
            f"compiled {_fmt(r['compiled_ms'], ' ms')}"
        )
        if r["speedup"]:
            line += f" ({r['speedup']:.2f}x)"
        if r["cudagraphs"]:
            line += f", CUDA graphs {r['cudagraphs']}"
        if r["replayed"]:
            line += (
                f", replayed {r['replayed']}x ({_fmt(r['client_ms'], ' ms')} on the client each)"
            )
        if r["break_even"] is not None:
            line += f", break-even at iteration {r['break_even']}"
        lines.append(line)
        if r["states"]:
            lines.append(f"    states: {sequence(r['states'])}")
    for u, row in zip(data.get("user_compiles", []), user_rows(data), strict=True):
        lines.append(
            f"  torch.compile {row['function']}: {row['compiles']} compile(s) in "
            f"{row['compile s']:.2f} s, {row['recompiles']} recompile(s), "
            f"{row['graph breaks']} graph break(s)"
            + (", recompile limit hit" if row["limit hit"] else "")
        )
        lines += [f"    {x}" for x in (calls_text(u), *breaks_text(u)) if x]
    reasons = reason_rows(data)
    if reasons:
        lines.append("reasons:")
        for r in reasons:
            lines.append(f"  {r['where']} {r['kind']}: {r['reason']}")
            lines.append(f"    → {r['what to do']}")
    return "\n".join(lines + ranks.lines(data.get("ranks", [])))


# -- HTML ------------------------------------------------------------------------------------
# Colours that read on light and dark themes: inherited ink, translucent fills.
STYLE = """<style>
.gt-dash{color:inherit;font-size:13px;line-height:1.4}
.gt-dash table{border-collapse:collapse;margin:4px 0 10px 0;color:inherit;background:transparent}
.gt-dash th,.gt-dash td{padding:2px 8px;text-align:left;vertical-align:top;
 border-bottom:1px solid rgba(128,128,128,.3);color:inherit;background:transparent}
.gt-fig{overflow-x:auto;margin:4px 0}
.gt-dash th{font-weight:600;border-bottom:1px solid rgba(128,128,128,.6)}
.gt-dash code{color:inherit;background:rgba(128,128,128,.15);padding:0 3px;border-radius:3px}
.gt-chip{padding:0 6px;border-radius:8px;background:rgba(128,128,128,.2)}
.gt-compiled{background:rgba(40,170,70,.25)}.gt-compiling,.gt-hot{background:rgba(60,130,240,.25)}
.gt-failed{background:rgba(230,60,60,.28)}.gt-reverted{background:rgba(240,150,30,.28)}
</style>"""


def _cell(col: str, v) -> str:
    if col == "status":
        return f"<span class='gt-chip gt-{html.escape(str(v))}'>{html.escape(str(v))}</span>"
    if col == "replayed":
        return html.escape(f"{v}x") if v else ""
    if col == "signature":
        return f"<code>{html.escape(str(v))}</code>"
    return html.escape(_fmt(v))


def _align(key: str) -> str:
    """Numbers right, text left: as an inline style (what Jupyter keeps, over its own
    right-aligned tables) and as ``align`` (what GitHub keeps)."""
    side = "right" if key in NUMERIC else "left"
    return f' style="text-align:{side}" align="{side}"'


def table(rows: list[dict], columns: tuple[str, ...], keys: tuple[str, ...] | None = None) -> str:
    """Rows as an HTML table (numbers right-aligned, as Jupyter and GitHub keep it)."""
    keys = keys or columns
    head = "".join(
        f"<th{_align(k)}>{html.escape(c)}</th>" for k, c in zip(keys, columns, strict=True)
    )
    body = "".join(
        "<tr>" + "".join(f"<td{_align(k)}>{_cell(k, r.get(k))}</td>" for k in keys) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def data_html(data: dict) -> str:
    """The data line as HTML ('' if nothing crossed)."""
    line = data_line(data)
    return f"<div>{html.escape(line)}</div>" if line else ""


def status_html(data: dict) -> str:
    """The compile-status table (one row per hot path) as HTML."""
    keys = tuple(k for k, _ in STATUS_COLUMNS)
    cols = tuple(c for _, c in STATUS_COLUMNS)
    rows = status_rows(data)
    if any(r["cudagraphs"] for r in rows):  # a GPU worker asked for CUDA graphs
        keys, cols = (*keys, "cudagraphs"), (*cols, "CUDA graphs")
    if any(r["replayed"] for r in rows):  # gt_core.jit replays: how often, at what client cost
        keys, cols = (*keys, "replayed", "client_ms"), (*cols, "replayed", "client ms")
    return table(rows, cols, keys) if rows else "<div><i>no hot path yet</i></div>"


def states_html(data: dict) -> str:
    """Each hot path's states as they passed, with their times (a state a poll may miss, such
    as ``hot`` before a background compile starts, is still listed); '' if none."""
    return "".join(
        f"<div><code>{html.escape(r['signature'])}</code> {html.escape(sequence(r['states']))}</div>"
        for r in status_rows(data)
        if r["states"]
    )


def reasons_html(data: dict) -> str:
    """The reasons table (recompiles, fallbacks, reverts, user diagnostics) as HTML; '' if none."""
    rows = reason_rows(data)
    return "<b>reasons</b>" + table(rows, REASON_COLUMNS) if rows else ""


def tables_html(data: dict, status: bool = True) -> str:
    """Status, user-compile and reasons tables in one block."""
    parts = [status_html(data), states_html(data)] if status else []
    if data.get("user_compiles"):
        parts.append("<b>torch.compile in this cell</b>" + table(user_rows(data), USER_COLUMNS))
    parts.append(reasons_html(data))
    if data.get("ranks"):  # a worker group: each rank's line
        parts.append("<b>worker group</b>" + table(ranks.rows(data["ranks"]), ranks.COLUMNS))
        replicated = data["ranks"][0].get("replicated", [])
        if replicated:  # a sharding group's ops that ran on whole values
            parts.append("<b>ran replicated</b>" + table(replicated, ("op", "reason")))
    return "".join(parts)


def figures_html(data: dict, signature: str | None = None) -> str:
    """The timeline, dependency graph and user compiles as inline SVG: no script, no CDN."""
    sig = signature or primary(data)
    events = data.get("events", [])
    figs = []
    if sig is not None:
        figs.append(_figures.timeline(_figures.timeline_of(data, sig)))
        g = _graphs.graph_of(events, sig)
        if g:
            figs.append(_graphs.graph(g, title=f"dependency graph {sig}"))
    user = _figures.compiles(data.get("user_compiles", []))
    if user is not None:
        figs.append(user)
    return "".join(figure_html(f) for f in figs)


def figure_html(fig) -> str:
    """One plotly figure as static HTML that untrusted notebooks, GitHub and nbconvert draw."""
    d = _bundles.as_dict(fig)
    return _bundles.img_html(d, title_of(d["layout"].get("title")) or "figure")


def to_html(data: dict, signature: str | None = None, figures: bool = True) -> str:
    """A static HTML dashboard: headline, figures (inline SVG) and tables."""
    body = f"<div><b>{html.escape(headline(data))}</b></div>{data_html(data)}"
    if figures:
        body += figures_html(data, signature)
    body += tables_html(data)
    return f"{STYLE}<div class='gt-dash'>{body}</div>"
