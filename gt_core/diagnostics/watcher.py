"""The sources of gt_core.diagnostics: Dynamo's compile records, its logs, its counters.

A :class:`Watcher` hooks into them for the length of one diagnostics block and hands what
they say to the event makers (:mod:`.compiles`, :mod:`.breaks`, :mod:`.skips`), which turn it
into ``user.*`` events; see :mod:`gt_core.diagnostics` for the design.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from gt_core.diagnostics import stance as _stance
from gt_core.diagnostics import torch_hooks as hooks
from gt_core.diagnostics.breaks import BreakEvents
from gt_core.diagnostics.calls import Calls
from gt_core.diagnostics.compiles import CompileEvents
from gt_core.diagnostics.guards import entries_of
from gt_core.diagnostics.names import Names, in_gt, is_ours
from gt_core.diagnostics.progress import Progress
from gt_core.diagnostics.recompile_causes import causes_of
from gt_core.diagnostics.skips import SkipEvents
from gt_core.diagnostics.torch_hooks import recompile_limit
from gt_core.observe import events as ev

__all__ = ["recompile_limit"]


class _Tap(logging.Filter):
    """Hands a logger's records to a handler; drops those it turned into events."""

    def __init__(self, handle, passthrough: bool = False):
        super().__init__()
        self.handle, self.passthrough = handle, passthrough

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            used = not in_gt() and self.handle(record)  # gt's own compiles log as before
        except Exception:  # a diagnostics bug must never break the user's compile
            used = False
        return self.passthrough or not used


class Watcher:
    """The state of one diagnostics block: hooks in place, what was seen so far."""

    def __init__(self, log: ev.EventLog, eager_every: int = 0):
        self.log = log
        self.lock = threading.RLock()  # records and log lines come from any thread
        self.names = Names()
        self.breaks = BreakEvents(self.emit, self.names)
        self.compiles = CompileEvents(self.emit, self.names, self.breaks)
        self.skips = SkipEvents(self.emit, self.names)
        self.calls = Calls(self.emit, eager_every)
        self.progress = Progress(self.emit)
        self.done: set[int] = set()  # ids of metrics records handled
        self.kept: list = []  # ...kept alive, so that no new record can reuse their ids
        self.undo: list = []
        self.started = False  # the compile records could be read

    # -- events ---------------------------------------------------------------------------
    def emit(self, type: str, **fields) -> None:
        self.log.emit(type, **fields)

    def unavailable(self, what: str, exc: BaseException) -> None:
        self.emit(
            ev.USER_FAILURE,
            function="?",
            kind="unavailable",
            reason=f"unavailable: {what} ({type(exc).__name__}: {exc})",
        )

    # -- hooks in and out -----------------------------------------------------------------
    def start(self) -> None:
        try:
            self.kept = hooks.compilation_metrics()
            self.done = {id(m) for m in self.kept}
            self.skips.start()
        except Exception as exc:
            self.unavailable("torch._dynamo.utils compilation metrics", exc)
            return
        self.started = True
        try:
            self.undo.append(hooks.hook_compilation_event(self._on_record))
            live = True
        except Exception as exc:
            self.unavailable("torch._dynamo.utils.log_compilation_event (live compile events)", exc)
            live = False
        try:
            self.undo.append(hooks.hook_recompile_check(self._on_recompile_check))
        except Exception as exc:
            self.unavailable(
                "torch._dynamo.convert_frame.get_and_maybe_log_recompilation_reasons "
                "(every cause of a recompile)",
                exc,
            )
        if live:  # (else a call that compiled would count as one that ran eagerly)
            self._watch_calls()
        try:
            self.undo.append(hooks.hook_compile_phases(self.progress.started, self.progress.ended))
            self.progress.start()
            self.undo.append(self.progress.stop)
        except Exception as exc:
            self.unavailable(
                "torch._dynamo.utils.get_chromium_event_logger (a compile's live progress)", exc
            )
        self._tap(hooks.GRAPH_BREAK_LOG, self.on_break_log, debug=True)
        self._tap(hooks.LIMIT_LOG, self.on_limit_log)
        # Dynamo also warns about .item() breaks on its own: the graph-break event says it all.
        self._tap(hooks.TENSOR_LOG, lambda r: "Graph break" in r.getMessage())
        self._tap(hooks.CUDAGRAPH_LOG, self.on_skip_log)
        try:
            cm = _stance.hooked()
            cm.__enter__()
            self.undo.append(lambda: cm.__exit__(None, None, None))
        except Exception as exc:
            self.unavailable(
                "torch._dynamo.eval_frame._callback_from_stance (names of modules)", exc
            )

    def _watch_calls(self) -> None:
        """Each call's outcome and time (see .calls)."""
        try:
            self.undo.append(hooks.hook_guard_complete(self.calls.guard))
        except Exception as exc:
            self.unavailable(
                "torch._C._dynamo.eval_frame.set_guard_complete_hook (each call's outcome)", exc
            )
            return
        try:
            self.undo.append(hooks.hook_compiled_graphs(self.calls.wrap_graph))
        except Exception as exc:
            self.unavailable(
                "torch._dynamo.output_graph.OutputGraph.call_user_compiler (time in graphs)", exc
            )
        cm = _stance.observing(self.calls.begin)
        cm.__enter__()
        self.undo.append(lambda: cm.__exit__(None, None, None))

    def stop(self) -> None:
        try:
            self.sweep()
            self.calls.flush()
            self.entries()
        finally:
            for undo in reversed(self.undo):
                with contextlib.suppress(Exception):
                    undo()
            self.undo.clear()

    def _tap(self, source: tuple[str, str | None], handle, debug: bool = False) -> None:
        """Filter logger ``source`` = (name, artifact) through ``handle``; ``debug``: enable
        its DEBUG records."""
        name, artifact = source
        logger = logging.getLogger(name)
        passthrough = artifact is not None and hooks.artifact_enabled(artifact)  # asked for
        tap = _Tap(handle, passthrough)
        level = logger.level
        logger.addFilter(tap)
        if debug and not logger.isEnabledFor(logging.DEBUG):
            logger.setLevel(logging.DEBUG)  # graph breaks are logged only when enabled

        def undo():
            logger.removeFilter(tap)
            logger.setLevel(level)

        self.undo.append(undo)

    # -- what the sources say -------------------------------------------------------------
    def _on_record(self, m) -> None:
        with contextlib.suppress(Exception):  # a diagnostics bug must never break a compile
            self.on_metrics(m)

    def _on_recompile_check(self, cache_entries, frame) -> None:
        with contextlib.suppress(Exception):  # a diagnostics bug must never break a compile
            if in_gt():
                return
            found = causes_of(cache_entries, frame)
            with self.lock:
                self.compiles.checked(hooks.current_compile_id() or "?", found)

    def on_metrics(self, m) -> None:
        with self.lock:
            if id(m) in self.done:
                return
            self.done.add(id(m))
            self.kept.append(m)
            cid = str(m.compile_id)
            if is_ours(m):
                self.compiles.causes.pop(cid, None)  # (found where gt's own frame recompiled)
                return
            if not m.fail_type:  # (past the limit, or failed: the call runs eagerly)
                self.calls.compiled_now()
            frame = cid.split("/")[0]
            fn = self.names.of_record(m, frame)
            if m.fail_type:
                self.compiles.failed(m, fn, cid, frame)
            else:
                self.compiles.compiled(m, fn, cid)
            self.breaks.flush(cid, fn, m)
            self.skips.from_record(m, fn, cid)
            if not m.fail_type:
                self.compiles.budget(m, fn)

    def on_break_log(self, record: logging.LogRecord) -> bool:
        with self.lock:
            return self.breaks.on_log(record)

    def on_limit_log(self, record: logging.LogRecord) -> bool:
        with self.lock:
            return self.compiles.on_limit_log(record)

    def on_skip_log(self, record: logging.LogRecord) -> bool:
        with self.lock:
            return self.skips.on_log(record)

    def sweep(self) -> None:
        """Records the live hook missed, breaks without a record, skips counted since."""
        if not self.started:
            return
        for m in hooks.compilation_metrics():
            self.on_metrics(m)
        with self.lock:
            self.breaks.sweep()
            self.skips.counted(self.names.last, "")

    def entries(self) -> None:
        """Each compiled function's cache entries as the block ends (``user.entries``): what
        torch kept, which the explanations check their words against (did a recompile make a
        value dynamic?)."""
        for name, codes in _stance.entered():
            if name not in self.compiles.functions:
                continue  # (compiled before this block)
            try:
                found = entries_of(codes)
            except Exception as exc:
                self.unavailable("torch._C._dynamo.eval_frame._debug_get_cache_entry_list", exc)
                return
            self.emit(ev.USER_ENTRIES, function=name, entries=found)

    def on_error(self, exc: BaseException) -> None:
        """A strict stance turned a recompile into an error: say so (the error still raises)."""
        with self.lock:
            self.compiles.on_error(exc)
