"""Cudagraph skips: ``user.cudagraph_skip`` events, from inductor's skip warnings, the skip
reason in a compile record, and its skip counter (bumped also where nothing is logged: CPU)."""

from __future__ import annotations

import logging

from gt_core.diagnostics import torch_hooks as hooks
from gt_core.diagnostics.names import USER_FRAME
from gt_core.observe import events as ev

__all__ = ["SkipEvents"]


class SkipEvents:
    """Each skip once: a logged or recorded skip also bumps the counter, so it is counted."""

    def __init__(self, emit, names):
        self.emit, self.names = emit, names
        self.logged: set[str] = set()  # compile ids whose cudagraph skip was logged
        self.seen: int | None = None  # the counter's value accounted for; None: no counter

    def start(self) -> None:
        self.seen = hooks.counted_cudagraph_skips()

    def on_log(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if "cudagraph" not in msg:
            return False
        cid = hooks.current_compile_id()
        fn = self.names.last
        frames = USER_FRAME.findall(msg)
        if frames:
            fn = self.names.of_code(frames[-1][0], frames[-1][2])
        elif cid is not None:
            fn = self.names.of_frame(cid.split("/")[0], fn)
        if cid is not None:
            self.logged.add(cid)
        self._count(1)  # this skip bumps the counter right after logging
        self.emit(
            ev.USER_CUDAGRAPH_SKIP,
            function=fn,
            compile_id=cid or "",
            reason=msg.strip()[:500],
            logged=True,
        )
        return True

    def from_record(self, m, fn: str, cid: str) -> None:
        """The skip a compile record names (unless logged), then those only counted."""
        if m.cudagraph_skip_reason and cid not in self.logged:
            self.logged.add(cid)
            self._count(1)
            self.emit(
                ev.USER_CUDAGRAPH_SKIP,
                function=fn,
                compile_id=cid,
                reason=m.cudagraph_skip_reason,
                logged=True,
            )
        self.counted(fn, cid)

    def counted(self, fn: str, cid: str) -> None:
        """Skips the counter shows beyond those logged or recorded: one event for them all."""
        if self.seen is None:
            return
        now = hooks.counted_cudagraph_skips()
        if now > self.seen:
            n, self.seen = now - self.seen, now
            self.emit(
                ev.USER_CUDAGRAPH_SKIP,
                function=fn,
                compile_id=cid,
                count=n,
                logged=False,
                reason=f"cudagraphs skipped {n} time(s), no reason logged "
                "(counters['inductor']['cudagraph_skips']; on CPU there are no CUDA graphs)",
            )

    def _count(self, n: int) -> None:
        if self.seen is not None:
            self.seen += n
