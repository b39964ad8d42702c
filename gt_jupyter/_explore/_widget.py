"""The explorer's widget: ipywidgets controls over the report's plain data, figures as the
dashboard's light plotly bundles inside Output widgets (never FigureWidget).

Each control changes one thing and the views that depend on it are redrawn in place; the
widget is never rebuilt. Its display bundle carries a static copy of the current view (an
image of the figure and a table) in an output of its own, which a saved notebook shows
where no widget runs, and which follows the view without re-rendering the widget.
"""

from __future__ import annotations

import functools
import html

import ipywidgets as w

from .. import _graphs
from .._bundles import bundle, img_html
from .._render import STYLE, table
from . import _data

__all__ = ["Explorer"]

TABS = ("Graph", "Source", "Code", "Compile", "Diff")


def _pre(text: str | None, empty: str) -> str:
    body = html.escape(text) if text else f"<i>{html.escape(empty)}</i>"
    return f"<pre style='max-height:420px;overflow:auto;font-size:11px'>{body}</pre>"


def _rows_html(rows: list[dict]) -> str:
    if not rows:
        return "<i>nothing to show</i>"
    return f"{STYLE}<div class='gt-dash'>{table(rows, tuple(rows[0]))}</div>"


class Explorer(w.VBox):
    """One hot path (or user compile) at a time: Graph, Source, Code, Compile and Diff."""

    def __init__(self, data: dict, sig: str | None = None, namespace: dict | None = None):
        self.data = data
        self.namespace = namespace or {}  # where the user's compiled functions are found
        self.opened: set[str] = set()  # the graph's groups drawn open
        # Each figure's output, shown only while its tab is: plotly's renderer fails to
        # resize a plot in a hidden tab (a console error), and hidden plots cost the page.
        self._figures: dict = {}
        self._quiet = False
        self._depth = 0  # controls' changes being drawn (nested: see _act)
        self._sent: str | None = None  # the static copy last shown
        self._shadow = None  # the static copy's hidden widget (see static_bundle)
        self.display_id: str | None = None  # set once shown: the static copy follows the view
        self.selector = w.Dropdown(options=_data.choices(data), description="explore")
        self.groups = w.SelectMultiple(description="open", rows=6)
        self.node = w.Dropdown(description="node")
        self.figure = w.Output()
        self.detail = w.HTML()
        self.source = w.HTML()
        self.code_kind = w.ToggleButtons(options=["generated", "FX"])
        self.code = w.HTML()
        self.compile = w.HTML()
        self.other = w.Dropdown(description="against")
        self.diff_words = w.HTML()
        self.diff_a, self.diff_b = w.Output(), w.Output()
        graph = w.VBox([w.HBox([self.groups, self.node]), self.figure, self.detail])
        diff = w.VBox([self.other, self.diff_words, w.HBox([self.diff_a, self.diff_b])])
        code = w.VBox([self.code_kind, self.code])
        self.tabs = w.Tab(children=[graph, self.source, code, self.compile, diff], titles=TABS)
        super().__init__([self.selector, self.tabs])
        if sig is not None:
            self.select(sig)
        self._draw()
        for control, then in (
            (self.selector, self._draw),
            (self.groups, self._open),
            (self.node, self._show_node),
            (self.code_kind, self._show_code),
            (self.other, self._show_diff),
            (self.tabs, self._place),
        ):
            name = "selected_index" if control is self.tabs else "value"
            control.observe(functools.partial(self._act, then), name)

    # -- what the user picks ---------------------------------------------------------------
    def select(self, key: str) -> None:
        """Show hot path ``key`` (a signature or its prefix; "user:fn" for a user compile)."""
        keys = [k for _, k in self.selector.options]
        hits = [k for k in keys if k == key] or [k for k in keys if k.startswith(key)]
        if len(hits) != 1:
            raise ValueError(f"explore: expected one of {keys}, got {key!r}")
        self.selector.value = hits[0]

    @property
    def path(self) -> dict | None:
        return _data.path_of(self.data, self.selector.value or "")

    def _draw(self) -> None:
        p = self.path
        with self.hold_sync():
            if p is None:
                self.groups.options, self.node.options = (), ()
                self._figures[self.figure] = ()
            else:
                opened = _data.auto_open(p["canonical"])
                self._quiet = True  # (the options and value set here redraw once, below)
                try:
                    self.groups.options = [
                        (f"{g} ({n})", g) for g, n in _data.groups(p["canonical"])
                    ]
                    self.groups.value = tuple(g for _, g in self.groups.options if g in opened)
                finally:
                    self._quiet = False
                self.opened = opened
                self._graph()
            self._show_source()
            self._show_code()
            self._show_compile()
            self._diff_choices()

    def _open(self) -> None:
        if self._quiet:
            return
        self.opened = set(self.groups.value)
        self._graph()

    def _graph(self) -> None:
        p = self.path
        g = _data.grouped_graph(p["canonical"], self._values(p), self.opened)
        self.graph_data = g
        fig = _graphs.graph(g, title=f"hot path {p['signature']}")
        self._figures[self.figure] = (_output(bundle(fig, f"hot path {p['signature']}")),)
        self._place()
        ops = [n for n in g["nodes"] if n["kind"] == "op"]
        self.node.options = [("(none)", "")] + [(f"{n['id']}: {n['label']}", n["id"]) for n in ops]
        self._show_node()

    def _values(self, p: dict) -> dict:
        from gt_core.observe import events as ev  # noqa: PLC0415

        for e in reversed(self.data["events"]):
            if e.get("type") == ev.DETECTED and e.get("signature") == p["signature"]:
                return e.get("values") or {}
        return {}

    def _show_node(self) -> None:
        p, node = self.path, self.node.value
        if p is None or not node:
            self.detail.value = "<i>pick a node to see its op, arguments and line</i>"
        else:
            d = _data.node_detail(p["canonical"], self._values(p), node)
            rows = [{"field": k, "value": _short(v)} for k, v in d.items()]
            self.detail.value = _rows_html(rows)

    def _show_source(self) -> None:
        p = self.path
        rows = _data.source_rows(self.data, p["signature"] if p else None)
        self.source.value = _rows_html(rows)

    def _show_code(self) -> None:
        code = (self.path or {}).get("code") or {}
        if self.code_kind.value == "FX":
            self.code.value = _pre(code.get("fx"), "no FX code yet (not compiled)")
        else:
            self.code.value = _pre(code.get("generated"), "no generated code (not compiled, or "
                                   "a backend that generates none)")  # fmt: skip

    def _show_compile(self) -> None:
        p = self.path
        if p is not None:
            self.compile.value = _rows_html(_data.compile_rows(p))
            return
        u = self._user()
        guards = _guards(self.namespace.get(u["function"]) if u else None)
        self.compile.value = _rows_html(_data.user_rows(u) if u else []) + _pre(
            guards, "each compile's guards: run %gt explore where the function is defined"
        )

    def _user(self) -> dict | None:
        name = (self.selector.value or "").removeprefix("user:")
        return next((u for u in self.data["user_compiles"] if u["function"] == name), None)

    def _diff_choices(self) -> None:
        mine = self.selector.value
        others = [
            (lb, k) for lb, k in self.selector.options if k != mine and not k.startswith("user:")
        ]
        self.other.options = [("(none)", "")] + others
        self._show_diff()

    def _show_diff(self) -> None:
        a, other = self.path, _data.path_of(self.data, self.other.value or "")
        if a is None or other is None:
            self.diff_words.value = "<i>pick another hot path to compare</i>"
            self._figures[self.diff_a] = self._figures[self.diff_b] = ()
            self._place()
            return
        words, da, db = _data.differing(a["canonical"], other["canonical"])
        self.diff_words.value = f"<b>{html.escape(words)}</b>"
        for out, p, marked in ((self.diff_a, a, da), (self.diff_b, other, db)):
            g = _data.grouped_graph(p["canonical"], self._values(p), opened=_all(p))
            for n in g["nodes"]:
                if n["id"] in marked:
                    n["label"] = "≠ " + str(n["label"])
                    n["freed"] = True  # drawn open: the differing nodes stand out
            fig = _graphs.graph(g, title=f"{p['signature']} (≠: differs)")
            self._figures[out] = (_output(bundle(fig, p["signature"])),)
        self._place()

    def _place(self) -> None:
        """Each figure into its Output if its tab is the one shown, else out of it."""
        tab = TABS[self.tabs.selected_index or 0] if hasattr(self, "tabs") else "Graph"
        for out, outputs in self._figures.items():
            want = "Graph" if out is self.figure else "Diff"
            shown = outputs if tab == want else ()
            if out.outputs != shown:
                out.outputs = shown

    # -- the static copy -----------------------------------------------------------------
    def static_html(self) -> str:
        """The current view as an image and a table: what a saved notebook shows."""
        tab = TABS[self.tabs.selected_index or 0]
        head = f"<b>gt explore</b>: {html.escape(str(self.selector.label))} · {tab}"
        if tab == "Graph" and self.path is not None:
            fig = _graphs.graph(self.graph_data, title=f"hot path {self.path['signature']}")
            d = fig.to_plotly_json()
            return f"<div>{head}{img_html(d, head, tips=False)}{self.detail.value}</div>"
        body = {"Source": self.source, "Code": self.code, "Compile": self.compile}.get(tab)
        return f"<div>{head}{body.value if body else self.diff_words.value}</div>"

    def __repr__(self) -> str:
        tab = TABS[self.tabs.selected_index or 0]
        return f"gt explore: {self.selector.label} · {tab}"

    def static_bundle(self) -> dict:
        """The static copy's own output: a hidden widget where widgets run (nothing shows
        twice), the copy's HTML wherever they do not (a saved notebook, GitHub, nbconvert)."""
        if self._shadow is None:
            self._shadow = w.Box(layout=w.Layout(display="none"))
        return {**_view(self._shadow, repr(self)), "text/html": self.static_html()}

    def _ipython_display_(self) -> None:
        """The widget, then its static copy with a display id: the copy follows the view
        (see _act) while the widget's own view is never re-rendered."""
        from IPython.display import display  # noqa: PLC0415

        display(_view(self, repr(self)), raw=True)
        self.display_id = self.display_id or f"gt-explore-{id(self):x}"
        b = self.static_bundle()
        self._sent = b["text/html"]
        display(b, raw=True, display_id=self.display_id)

    def _act(self, then, change=None) -> None:
        """A control changed: ``then`` redraws what depends on it; once the outermost
        change is drawn, the static copy follows (re-sent only when it changed)."""
        self._depth += 1
        try:
            then()
        finally:
            self._depth -= 1
        if self._depth or self.display_id is None:
            return
        b = self.static_bundle()
        if b["text/html"] != self._sent:
            from IPython.display import update_display  # noqa: PLC0415

            self._sent = b["text/html"]
            update_display(b, raw=True, display_id=self.display_id)


def _view(widget: w.Widget, text: str) -> dict:
    """A widget's display bundle: its view where widgets run, ``text`` elsewhere."""
    view = {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
    return {"text/plain": text, "application/vnd.jupyter.widget-view+json": view}


def _guards(fn) -> str | None:
    """Each cache entry of a compiled function with its guards (gt_core.diagnostics.explain),
    or None where ``fn`` is not one."""
    if fn is None or not callable(fn):
        return None
    from ..options import diagnostics_module  # noqa: PLC0415

    try:
        return diagnostics_module().explain(fn)
    except TypeError:  # not a torch.compile'd function or module
        return None


def _output(b: dict) -> dict:
    return {"output_type": "display_data", "data": b, "metadata": {}}


def _all(p: dict) -> set:
    return {g for g, _ in _data.groups(p["canonical"])}


def _short(v) -> str:
    s = str(v)
    return s if len(s) < 300 else s[:300] + " …"
