"""Graph breaks: ``user.graph_break`` events, with the break's ``file:line`` and the user's
stack down to it where Dynamo's graph-break log gave them, else the reasons its compile
record lists."""

from __future__ import annotations

import logging
import re

from gt_core.diagnostics import torch_hooks as hooks
from gt_core.observe import events as ev
from gt_core.observe.causes import short_reason

__all__ = ["BreakEvents"]


_SKIPPED = "Skipping the function and falling back to eager"
_FRAME = re.compile(r'^  File "(.+?)", line (\d+), in (.+)$')


def user_stack(msg: str) -> list[dict]:
    """The frames of a graph-break log's "User code traceback", outermost first: each
    ``{"where": "file:line", "function": name, "text": its source line}`` (Dynamo leaves it out
    of a break it logged before: then [])."""
    lines = msg.split("\nUser code traceback:\n", 1)[-1].splitlines() if "User code" in msg else []
    frames: list[dict] = []
    for line in lines:
        m = _FRAME.match(line)
        if m:
            frames.append({"where": f"{m[1]}:{m[2]}", "function": m[3], "text": ""})
        elif frames and not frames[-1]["text"] and line.strip() and set(line.strip()) != {"^"}:
            frames[-1]["text"] = line.strip()
    return frames


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
            "detail": body[:4000],
            "stack": user_stack(msg),
        }
        self.pending.setdefault(hooks.current_compile_id() or "?", []).append(brk)
        return True

    def skipped(self, cid: str) -> bool:
        """Whether Dynamo logged a break of compile ``cid`` that it could not resume from (in
        a loop): it skips the whole function, which then runs eagerly; nothing raised."""
        return any(_SKIPPED in b["detail"] for b in self.pending.get(cid, ()))

    def raised(self, m, cid: str, reason: str) -> None:
        """fullgraph=True: the break raised, and the failed compile's record says where."""
        where = m.fail_user_frame_filename or ""
        where = f"{where}:{m.fail_user_frame_lineno}" if where else ""
        brk = {"reason": short_reason(reason), "where": where, "detail": reason[:4000]}
        for b in self.pending.setdefault(cid, [brk]):
            b["raised"] = True

    def flush(self, cid: str, fn: str, m) -> None:
        """The breaks of compile ``cid``, now that its record came."""
        logged = self.pending.pop(cid, None)
        if logged is None:  # no log record: the reasons from the metrics, without a place
            logged = [
                {"reason": short_reason(r), "where": "", "detail": r[:4000]}
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
