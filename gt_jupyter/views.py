"""What ``%gt`` commands return: objects that print as text and render as static HTML.

Like ``%timeit``'s ``TimeitResult``: a result is an object, not printed output, so it can be
kept in a variable, shown again, or saved with the notebook. No torch import here.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from gt_core.observe import events as ev

from . import _bundles, _graphs, _render, _tables

__all__ = ["Text", "StatusView", "GraphView", "status_view", "graph_view"]


@dataclass
class Text:
    """A plain message (a command's answer)."""

    text: str

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<pre class='gt-dash'>{html.escape(self.text)}</pre>"


@dataclass
class StatusView:
    """``%gt status``: the worker, and every hot path with its compile state."""

    worker: dict
    data: dict

    def lines(self) -> list[str]:
        w = self.worker
        if w.get("started"):
            head = f"worker: pid {w['pid']} on {w['device']}, {'alive' if w['alive'] else 'DEAD'}"
        else:
            head = "worker: not started (the next %%gt cell starts one)"
        s = _tables.summary(self.data)
        data = _render.data_line(self.data)  # what crossed per iteration, if anything did
        # fallbacks: compiled runs that failed, so their block ran eagerly from then on
        fallbacks = sum(e.get("type") == ev.FALLBACK for e in self.data.get("events", ()))
        return [
            head,
            f"hot paths: {s['hot_paths']}, compiled {s['compiled']}, compiling {s['compiling']}, "
            f"failed {s['failed']}, reverted {s['reverted']}, fallbacks {fallbacks}"
            + (f", retired {s['retired']}" if s["retired"] else "")
            + "; "
            f"{s['ops']} ops recorded",
            *([data] if data else []),
            *_render.to_text(self.data, head=False).splitlines(),
        ]

    def __repr__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        head = "<br>".join(html.escape(x) for x in self.lines()[:2])
        body = _render.data_html(self.data) + _render.tables_html(self.data)
        return f"{_render.STYLE}<div class='gt-dash'>{head}{body}</div>"


def status_view(data: dict, worker) -> StatusView:
    """The status of ``worker`` (a gt_core WorkerHandle; not started is fine) and ``data``."""
    info = {"started": worker.started}
    if worker.started:
        info.update(pid=worker.pid, device=worker.device, alive=worker.alive)
    return StatusView(info, data)


@dataclass
class GraphView:
    """``%gt graph``: one hot path's dependency graph (plotly live; an SVG image as static HTML)."""

    signature: str
    graph: dict

    @property
    def figure(self):
        return _graphs.graph(self.graph, title=f"dependency graph {self.signature}")

    def __repr__(self) -> str:
        nodes = self.graph.get("nodes", [])
        ops = [n for n in nodes if n.get("kind") == "op"]
        kinds: dict[str, int] = {}
        for n in ops:
            k = _graphs.op_kind(n) or "?"
            kinds[k] = kinds.get(k, 0) + 1
        top = ", ".join(f"{k}×{c}" for k, c in sorted(kinds.items(), key=lambda kc: -kc[1])[:8])
        return (
            f"dependency graph {self.signature}: {len(ops)} ops, {len(nodes) - len(ops)} inputs/outputs, "
            f"{len(self.graph.get('edges', []))} edges; most common: {top}"
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return _bundles.bundle(self.figure, repr(self))


def graph_view(data: dict, signature: str) -> GraphView:
    g = _graphs.graph_of(data.get("events", []), signature)
    if g is None:
        from IPython.core.error import UsageError  # noqa: PLC0415

        raise UsageError(f"%gt graph: no dependency graph recorded for {signature}")
    return GraphView(signature, g)
