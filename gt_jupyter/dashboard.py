"""Dashboard: one live view per %%gt cell, updated in place, with a static HTML fallback.

The dashboard reads only the plain dict of ``gt_core.report.summarize`` (no torch). In a
kernel with ipywidgets it is a VBox of plotly FigureWidgets updated in place; in a kernel
without widgets it re-renders static HTML through a display handle; in a terminal it shows
a text summary once, at the end. The static HTML draws its figures as inline SVG (no script),
so a saved notebook shows them on GitHub and through nbconvert too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from . import _figures, _graphs, _render, _tables

__all__ = ["Dashboard", "LiveUpdater", "EMPTY", "SHOW", "frontend_mode"]

EMPTY = {
    "hot_paths": [],
    "user_compiles": [],
    "stats": {"ops": 0, "frees": 0, "syncs": 0, "uploads": 0},
    "worker": {},
    "events": [],
}
SHOW = ("all", "status", "none")  # what a dashboard shows: everything, tables only, nothing
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
GRAPH_FILTERS = {"auto": None, "all ops": (), "hide aliases": _graphs.ALIAS_OPS}
HTML_EVERY_S = 1.0  # static-HTML mode re-renders at most this often while live


def frontend_mode(shell=None) -> str:
    """'widget' in a kernel with ipywidgets, 'html' in a kernel without, else 'text'."""
    if shell is None:
        from IPython import get_ipython  # noqa: PLC0415

        shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return "text"
    try:
        import ipywidgets  # noqa: F401, PLC0415
    except ImportError:
        return "html"
    return "widget"


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
        self._view: _View | None = None
        self._handle = None
        self._html_at = 0.0
        self._html_cache: tuple | None = None
        self._lock = threading.RLock()

    # -- user-facing API -------------------------------------------------------------------
    @property
    def signatures(self) -> list[str]:
        """Signatures of the hot paths in the data, in order of first appearance."""
        return [p["signature"] for p in self.data.get("hot_paths", [])]

    @property
    def signature(self) -> str | None:
        """The hot path shown in the figures: the user's pick, else the primary one."""
        if self._selected in self.signatures:
            return self._selected
        return _tables.primary(self.data)

    @property
    def live(self) -> bool:
        """Whether the dashboard redraws while the cell runs (not in a terminal, not hidden)."""
        return self.mode != "text" and self.show != "none"

    @property
    def widget(self):
        """The ipywidgets VBox (built on first use; None outside widget mode)."""
        if self.mode != "widget":
            return None
        if self._view is None:
            self._view = _View(self)
            self._view.refresh(self.data)
        return self._view.root

    def select(self, signature: str | None) -> None:
        """Show ``signature`` in the figures (None: follow the latest hot path)."""
        with self._lock:
            self._selected = signature
            if self._view is not None:
                self._view.refresh(self.data)

    def figures(self) -> tuple:
        """The timeline and dependency-graph figures of the shown hot path (graph may be None)."""
        sig = self.signature
        if sig is None:
            return None, None
        events = self.data.get("events", [])
        g = _graphs.graph_of(events, sig)
        hide = GRAPH_FILTERS[self.graph_filter]
        return (
            _figures.timeline(_figures.timeline_of(self.data, sig)),
            _graphs.graph(g, title=f"dependency graph {sig}", hide_ops=hide) if g else None,
        )

    def display(self, display_id: str | None = None):
        """Show the dashboard now, under ``display_id``; returns the display handle (or None)."""
        if not self.live:
            return None
        from IPython.display import display  # noqa: PLC0415

        self._handle = display(self, display_id=display_id or True)
        self._html_at = time.monotonic()
        return self._handle

    def update(self, data: dict) -> None:
        """Show new data: widgets change in place; the HTML fallback re-renders, throttled."""
        with self._lock:
            self.data = data
            if self._view is not None:
                self._view.refresh(data)
            elif self.mode == "html" and self._handle is not None:
                if time.monotonic() - self._html_at >= HTML_EVERY_S:
                    self._html_at = time.monotonic()
                    self._handle.update(self)

    def finalize(self, data: dict | None = None) -> None:
        """Last update when the cell is done; the saved notebook keeps this static HTML."""
        with self._lock:
            if data is not None:
                self.update(data)
            self.final = True
            if self.show == "none":
                return
            if self._handle is not None:
                self._handle.update(self)
            elif self.mode == "text":
                from IPython.display import display  # noqa: PLC0415

                display(self)

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
        def want(mime: str) -> bool:
            return (include is None or mime in include) and not (exclude and mime in exclude)

        bundle = {"text/plain": self.to_text()}
        if want("text/html"):
            bundle["text/html"] = self.to_html()
        if self.mode == "widget" and self.show != "none" and want(WIDGET_MIME):
            bundle[WIDGET_MIME] = self.widget._repr_mimebundle_()[WIDGET_MIME]
        return bundle


class _View:
    """The widget tree of a Dashboard; refreshed in place, never rebuilt."""

    def __init__(self, dash: Dashboard):
        import ipywidgets as w  # noqa: PLC0415
        import plotly.graph_objects as go  # noqa: PLC0415

        self.dash = dash
        self.headline = w.HTML()
        self.tables = w.HTML()
        self.selector = w.Dropdown(description="hot path", layout=w.Layout(width="max-content"))
        self.filter = w.ToggleButtons(
            options=list(GRAPH_FILTERS),
            value=dash.graph_filter,
            description="graph",
            style={"button_width": "auto"},
        )
        self.timeline = go.FigureWidget()
        self.graph = go.FigureWidget()
        self._labels: list = []
        self._graph_key = None
        self._setting = False
        # A FigureWidget's own layout is plotly's: the boxes around them are what hide.
        self.graph_box = w.Box([self.graph])
        self.timeline_box = w.Box([self.timeline])
        self.user = go.FigureWidget()
        self.user_box = w.Box([self.user], layout=w.Layout(display="none"))
        self._user_key = None
        children = [self.headline]
        if dash.show == "all":
            children += [
                w.HBox([self.selector, self.filter]),
                self.timeline_box,
                self.graph_box,
                self.user_box,
            ]
        self.root = w.VBox(children + [self.tables])
        self.selector.observe(self._on_select, "value")
        self.filter.observe(self._on_filter, "value")

    def _on_select(self, change) -> None:
        if not self._setting:
            self.dash.select(change["new"])

    def _on_filter(self, change) -> None:
        self.dash.graph_filter = change["new"]
        self.refresh(self.dash.data)

    def refresh(self, data: dict) -> None:
        sig = self.dash.signature
        self.headline.value = (
            f"{_render.STYLE}<div class='gt-dash'><b>{_render.headline(data)}</b></div>"
        )
        self.tables.value = f"<div class='gt-dash'>{_render.tables_html(data)}</div>"
        if self.dash.show != "all":
            return
        labels = [
            (f"{p['signature']} · {p['status']} · {p.get('n_ops', 0)} ops", p["signature"])
            for p in data.get("hot_paths", [])
        ]
        if labels != self._labels or self.selector.value != sig:
            self._setting = True
            try:
                with self.selector.hold_sync():
                    self.selector.options = labels
                    self.selector.value = sig
            finally:
                self._setting = False
            self._labels = labels
        self.selector.layout.display = None if len(labels) > 1 else "none"
        user = data.get("user_compiles", [])
        key = [(u["function"], len(u.get("timeline", ())), u.get("limit_hit")) for u in user]
        if key != self._user_key:
            self._user_key = key
            fig = _figures.compiles(user)
            if fig is not None:
                _replace(self.user, fig)
            self.user_box.layout.display = None if fig is not None else "none"
        self.timeline_box.layout.display = None if sig is not None else "none"
        if sig is None:
            self.graph_box.layout.display = self.filter.layout.display = "none"
            return
        events = data.get("events", [])
        _replace(
            self.timeline, _figures.timeline(_figures.timeline_of(data, sig)), keep_traces=True
        )
        g = _graphs.graph_of(events, sig)
        key = (sig, id(g), self.dash.graph_filter)
        if g is not None and key != self._graph_key:
            self._graph_key = key
            hide = GRAPH_FILTERS[self.dash.graph_filter]
            _replace(self.graph, _graphs.graph(g, title=f"dependency graph {sig}", hide_ops=hide))
        self.graph_box.layout.display = None if g is not None else "none"
        self.filter.layout.display = None if g is not None else "none"


def _replace(fw, fig, keep_traces: bool = False) -> None:
    """Make FigureWidget ``fw`` show ``fig``: restyle traces in place when their count matches."""
    if keep_traces and len(fw.data) == len(fig.data):
        with fw.batch_update():
            for old, new in zip(fw.data, fig.data, strict=False):
                old.x, old.y = new.x, new.y
            fw.layout.title = fig.layout.title
            fw.layout.shapes = fig.layout.shapes
            fw.layout.annotations = fig.layout.annotations
        return
    with fw.batch_update():
        fw.data = []
    fw.add_traces(list(fig.data))
    fw.layout = fig.layout


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
