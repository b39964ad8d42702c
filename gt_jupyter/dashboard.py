"""Dashboard: one live view per %%gt cell, updated in place, light on the wire, durable.

The dashboard reads only the plain dict of ``gt_core.observe.report.summarize`` (no torch). In a
kernel with a display it is a few outputs, each its own display id: the headline, the
timeline, the dependency graph, the user's compiles and the tables. Each is a MIME bundle
(figures: plotly's JSON, drawn by the notebook's plotly renderer, which reaches the page
once); an update re-sends only the outputs whose content changed. No widget is used, so a
page reload and a saved notebook show the outputs as they are. The hot-path choice and the
graph modes are menus inside the figures and work without a kernel.

While the cell runs, figures are images (a data-URI SVG ``<img>``, redrawn at each update:
plotly's renderer cannot be updated in place in JupyterLab); the final update makes each
figure interactive plotly and keeps the image beside it, which untrusted notebooks, GitHub
and nbconvert draw. In a terminal the dashboard shows a text summary once, at the end.
"""

from __future__ import annotations

import hashlib
import html
import json
import threading
import time
from collections.abc import Callable

from gt_core.observe.report import summarize

from . import _bundles, _figures, _graphs, _render, _tables

__all__ = ["Dashboard", "LiveUpdater", "EMPTY", "SHOW", "frontend_mode"]

EMPTY = summarize([])  # no hot path, no compile, counters at zero, nothing moved
SHOW = ("all", "status", "none")  # what a dashboard shows: everything, tables only, nothing
GRAPH_FILTERS = {"auto": None, "all ops": (), "hide aliases": _graphs.ALIAS_OPS}
PARTS = ("headline", "timeline", "graph", "compiles", "tables")
MAX_PATHS = 4  # hot paths a figure's menu offers: the shown one and the latest others
UPDATE_EVERY_S = 0.5  # live redraws at most this often


def frontend_mode(shell=None) -> str:
    """'notebook' in a kernel (outputs are display bundles), else 'text'."""
    if shell is None:
        from IPython import get_ipython  # noqa: PLC0415

        shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return "text"
    return "notebook"


class Dashboard:
    """What gt did in one cell: headline, timeline, dependency graph, status and reasons."""

    def __init__(self, data: dict | None = None, *, show: str = "all", mode: str | None = None):
        if show not in SHOW:
            raise ValueError(f"show: expected one of {', '.join(SHOW)}, got {show!r}")
        self.show = show
        self.mode = mode or frontend_mode()
        self.data = data or EMPTY
        self.final = False
        self._selected: str | None = None  # the user's pick; None follows the primary path
        self.graph_filter = "auto"
        self._ids: dict[str, str] = {}  # part -> display id, once displayed
        self._sent: dict[str, str] = {}  # part -> digest of what the frontend shows
        self._plotly: dict[str, bool] = {}  # part -> the frontend draws it with plotly
        self.sent_bytes: list[int] = []  # size of each message sent (display or update)
        self._at = 0.0
        self._html_cache: tuple | None = None
        self._graph_cache: tuple | None = None
        self._lock = threading.RLock()

    # -- user-facing API -------------------------------------------------------------------
    @property
    def signatures(self) -> list[str]:
        """Signatures of the hot paths in the data, in order of first appearance."""
        return [p["signature"] for p in self.data.get("hot_paths", [])]

    @property
    def signature(self) -> str | None:
        """The hot path shown first in the figures: the user's pick, else the primary one."""
        if self._selected in self.signatures:
            return self._selected
        return _tables.primary(self.data)

    @property
    def live(self) -> bool:
        """Whether the dashboard redraws while the cell runs (not in a terminal, not hidden)."""
        return self.mode != "text" and self.show != "none"

    def select(self, signature: str | None) -> None:
        """Show ``signature`` first in the figures (None: follow the latest hot path)."""
        with self._lock:
            self._selected = signature
            self._push(force=True)

    def figures(self) -> tuple:
        """The timeline and dependency-graph figures of the shown hot path (graph may be None)."""
        sig = self.signature
        if sig is None:
            return None, None
        g = _graphs.graph_of(self.data.get("events", []), sig)
        hide = GRAPH_FILTERS[self.graph_filter]
        return (
            _figures.timeline(_figures.timeline_of(self.data, sig)),
            _graphs.graph(g, title=f"dependency graph {sig}", hide_ops=hide) if g else None,
        )

    def bundles(self, live: bool = False) -> dict[str, dict]:
        """Each part's display bundle ({} for a part with nothing to show yet); ``live``:
        figures as images only (while the cell runs), else plotly with the image beside."""
        data = self.data
        parts = dict.fromkeys(PARTS, {})
        head = _render.headline(data)
        parts["headline"] = {  # with the data line: the cell's counters
            "text/plain": "\n".join(x for x in (head, _render.data_line(data)) if x),
            "text/html": f"{_render.STYLE}<div class='gt-dash'><b>{html.escape(head)}</b>"
            f"{_render.data_html(data)}</div>",
        }
        parts["tables"] = {
            "text/plain": _render.to_text(data, head=False),
            "text/html": f"{_render.STYLE}<div class='gt-dash'>{_render.tables_html(data)}</div>",
        }
        if self.show != "all":
            return parts
        shown = self._paths()
        if shown:
            parts["timeline"] = self._timeline(shown, live)
            parts["graph"] = self._graph(shown, live)
        user = _figures.compiles(data.get("user_compiles", []))
        if user is not None:
            parts["compiles"] = _figure(user, "torch.compile: compiles and recompiles", live)
        return parts

    def display(self, display_id: str | None = None):
        """Show the dashboard now (one output per part, ids derived from ``display_id``)."""
        if not self.live:
            return None
        from IPython.display import display  # noqa: PLC0415

        base = display_id or "gt-" + hex(id(self))[2:]
        with self._lock:
            for part, b in self.bundles(live=True).items():
                self._ids[part] = f"{base}-{part}"
                self._sent[part] = _digest(b)
                self.sent_bytes.append(_bundles.nbytes(b))
                display(b, raw=True, display_id=self._ids[part])
            self._at = time.monotonic()
        return self._ids

    def update(self, data: dict) -> None:
        """Show new data: the parts that changed are re-sent, at most every UPDATE_EVERY_S."""
        with self._lock:
            self.data = data
            if self._ids and time.monotonic() - self._at >= UPDATE_EVERY_S:
                self._push(force=False)

    def finalize(self, data: dict | None = None) -> None:
        """Last update when the cell is done: every part with its static copy, as saved."""
        with self._lock:
            if data is not None:
                self.data = data
            self.final = True
            if self.show == "none":
                return
            if self._ids:
                self._push(force=False)
            elif self.mode == "text":
                from IPython.display import display  # noqa: PLC0415

                display(self)

    def _push(self, force: bool) -> None:
        """Send the parts that changed: images while live, plotly once final."""
        if not self._ids:
            return
        from IPython.display import update_display  # noqa: PLC0415

        live = self.bundles(live=True)
        sent = live if not self.final else self.bundles(live=False)
        for part, b in sent.items():
            key = _digest(b)
            if not force and key == self._sent.get(part):
                continue
            if _bundles.PLOTLY_MIME in b and self._plotly.get(part):
                # a drawn plotly output ignores new figures: an image first gives it a new one
                update_display(live[part], raw=True, display_id=self._ids[part])
            self._sent[part] = key
            self._plotly[part] = _bundles.PLOTLY_MIME in b
            self.sent_bytes.append(_bundles.nbytes(b))
            update_display(b, raw=True, display_id=self._ids[part])
        self._at = time.monotonic()

    # -- figures with their menus ----------------------------------------------------------
    def _paths(self) -> list[str]:
        """The hot paths the figures offer: the shown one first, then the latest others."""
        sig = self.signature
        if sig is None:
            return []
        by_time = sorted(
            self.data.get("hot_paths", []),
            key=lambda p: p.get("detected_at") or 0.0,
            reverse=True,
        )
        others = [p["signature"] for p in by_time if p["signature"] != sig]
        return [sig, *others[: MAX_PATHS - 1]]

    def _timeline(self, sigs: list[str], live: bool) -> dict:
        points = _figures.LIVE_POINTS if live else _figures.MAX_POINTS
        figs = [
            (s, _bundles.as_dict(_figures.timeline(_figures.timeline_of(self.data, s), points)))
            for s in sigs
        ]
        fig = figs[0][1] if len(figs) == 1 else _bundles.merge_variants(figs, 0, dropdown=True)
        return _figure(fig, f"timeline {sigs[0]}", live)

    def _graph(self, sigs: list[str], live: bool) -> dict:
        events = self.data.get("events", [])
        graphs = [(s, _graphs.graph_of(events, s)) for s in sigs]
        # graph_of returns the same object while a path's graph is unchanged: lay it out once
        key = (tuple((s, id(g)) for s, g in graphs), self.graph_filter, live)
        if self._graph_cache is None or self._graph_cache[0] != key:
            self._graph_cache = (key, self._graph_bundle(sigs, graphs, live))
        return self._graph_cache[1]

    def _graph_bundle(self, sigs: list[str], graphs: list, live: bool) -> dict:
        variants = []
        for s, g in graphs:
            if g is None:
                continue
            for mode, hide in GRAPH_FILTERS.items():
                fig = _graphs.graph(g, title=f"dependency graph {s}", hide_ops=hide)
                label = mode if len(sigs) == 1 else f"{s} · {mode}"
                variants.append((label, _bundles.as_dict(fig)))
        if not variants:
            return {}
        shown = list(GRAPH_FILTERS).index(self.graph_filter)
        fig = _bundles.merge_variants(variants, shown, dropdown=len(sigs) > 1)
        return _figure(fig, f"dependency graph {sigs[0]}", live)

    # -- views -----------------------------------------------------------------------------
    def to_text(self) -> str:
        """The plain-text summary (what a terminal shows)."""
        return _render.to_text(self.data)

    def to_html(self) -> str:
        """The static HTML dashboard (figures unless show='status', tables)."""
        key = (
            len(self.data.get("events", [])),
            id(self.data),
            self.signature,
            self.show,
            self.graph_filter,
        )
        if self._html_cache is None or self._html_cache[0] != key:
            self._html_cache = (
                key,
                _render.to_html(self.data, self.signature, figures=self.show == "all"),
            )
        return self._html_cache[1]

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        n = len(self.signatures)
        return (
            f"<gt Dashboard: {n} hot path{'s' if n != 1 else ''}{', final' if self.final else ''}>"
        )

    def _repr_html_(self) -> str:
        return self.to_html()

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """Shown as an object (``%gt dashboard``, a terminal): text and static HTML."""
        return {"text/plain": self.to_text(), "text/html": self.to_html()}


def _figure(fig, text: str, live: bool) -> dict:
    return _bundles.live_bundle(fig, text) if live else _bundles.bundle(fig, text)


def _digest(bundle: dict) -> str:
    return hashlib.sha1(json.dumps(bundle, sort_keys=True, default=str).encode()).hexdigest()


class LiveUpdater:
    """A background thread that redraws a dashboard whenever the event count changes."""

    def __init__(
        self,
        dashboard: Dashboard,
        get_data: Callable[[], dict],
        *,
        count: Callable[[], int] | None = None,
        interval: float = 0.3,
    ):
        self.dashboard = dashboard
        self.get_data = get_data
        self.count = count  # cheap change check; without it every poll calls get_data
        self.interval = interval
        self.data: dict | None = None
        self.error: BaseException | None = None  # the last failure, kept, never printed
        self._last: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LiveUpdater:
        """Start polling (a daemon thread)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gt-dashboard", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self, force: bool = False) -> bool:
        """Redraw if the events changed (or ``force``); True when it redrew."""
        try:
            n = self.count() if self.count is not None else None
            if not force and n is not None and n == self._last:
                return False
            data = self.get_data()
            n = len(data.get("events", [])) if n is None else n
            if not force and n == self._last:
                return False
            self._last, self.data = n, data
            self.dashboard.update(data)
            return True
        except Exception as exc:  # a live view must never break the user's cell
            self.error = exc
            return False

    def stop(self) -> dict | None:
        """Stop the thread, wait for it, redraw once more; returns the last data."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll(force=True)
        return self.data

    def __enter__(self) -> LiveUpdater:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
