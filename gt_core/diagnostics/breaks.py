"""Graph breaks: ``user.graph_break`` events, with the break's ``file:line`` where Dynamo's
graph-break log gave one, else the reasons its compile record lists."""

from __future__ import annotations

import logging
import re

from gt_core.diagnostics import torch_hooks as hooks
from gt_core.observe import events as ev
from gt_core.observe.causes import short_reason

__all__ = ["BreakEvents"]


class BreakEvents:
    """Breaks logged during a compile, held until its record names the function."""

    def __init__(self, emit, names):
        self.emit, self.names = emit, names
        self.pending: dict[str, list[dict]] = {}  # compile id -> graph breaks logged

    def on_log(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        loc = re.search(r"in user code at (.+?):(\d+)", msg)
        body = msg.split("Graph Break Reason:", 1)[-1].split("\nUser code traceback:", 1)[0].strip()
        brk = {
            "reason": short_reason(msg),
            "where": f"{loc[1]}:{loc[2]}" if loc else "",
            "detail": body[:1000],
        }
        self.pending.setdefault(hooks.current_compile_id() or "?", []).append(brk)
        return True

    def raised(self, m, cid: str, reason: str) -> None:
        """fullgraph=True: the break raised, and the failed compile's record says where."""
        where = m.fail_user_frame_filename or ""
        where = f"{where}:{m.fail_user_frame_lineno}" if where else ""
        brk = {"reason": short_reason(reason), "where": where, "detail": reason[:1000]}
        self.pending.setdefault(cid, [brk])

    def flush(self, cid: str, fn: str, m) -> None:
        """The breaks of compile ``cid``, now that its record came."""
        logged = self.pending.pop(cid, None)
        if logged is None:  # no log record: the reasons from the metrics, without a place
            logged = [
                {"reason": short_reason(r), "where": "", "detail": r[:1000]}
                for r in sorted(m.restart_reasons or ())
                if "recompile limit" not in r
            ]
        for b in logged:
            self.emit(ev.USER_GRAPH_BREAK, function=fn, compile_id=cid, **b)

    def sweep(self) -> None:
        """Breaks whose compile made no record: named by their frame's function."""
        for cid, breaks in list(self.pending.items()):
            fn = self.names.of_frame(cid.split("/")[0])
            for b in breaks:
                self.emit(ev.USER_GRAPH_BREAK, function=fn, compile_id=cid, **b)
        self.pending.clear()
