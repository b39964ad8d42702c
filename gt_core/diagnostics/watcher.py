"""The sources of gt_core.diagnostics: Dynamo's compile records, its logs, its counters.

A :class:`_Watcher` hooks into them for the length of one diagnostics block and turns what
they say into ``user.*`` events; see :mod:`gt_core.diagnostics` for the design.
"""

from __future__ import annotations

import contextlib
import linecache
import logging
import os
import re
import threading

from gt_core.diagnostics import stance as _stance
from gt_core.observe import events as ev
from gt_core.observe.causes import budget_message, short_reason

_GT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # gt_core
_EXAMPLES = os.path.join(_GT_DIR, "examples")  # user code, though it ships with gt
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<fn>.+?)_at_\d+$")
_USER_FRAME = re.compile(
    r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n\s*(?P<src>[^\n]*)'
)
_LIMIT = re.compile(
    r"hit config\.(?P<type>\w+) \((?P<limit>\d+)\)\s+function: '(?P<fn>[^']+)' \((?P<where>[^)]*)\)"
    r"\s+last reason: (?P<reason>.*?)(?:\nTo log all|\Z)",
    re.S,
)
_BUDGET_SHARE = 0.75  # warn once this share of the recompile limit is used


def recompile_limit(limit_type: str = "recompile_limit") -> int:
    """Dynamo's recompile limit (``recompile_limit``; ``cache_size_limit`` before 2.6)."""
    import torch._dynamo.config as config

    if limit_type != "recompile_limit" and isinstance(getattr(config, limit_type, None), int):
        return getattr(config, limit_type)  # accumulated_recompile_limit
    return int(getattr(config, "recompile_limit", None) or getattr(config, "cache_size_limit", 8))


def _where(reason: str) -> tuple[str, str]:
    """(``file:line``, source line) of the last user frame a Dynamo text names, or ('', '')."""
    frames = list(_USER_FRAME.finditer(reason or ""))
    if not frames:
        return "", ""
    m = frames[-1]
    return f"{m['file']}:{m['line']}", m["src"].strip()


def _qualname(co_name: str, filename: str, lineno: int) -> str:
    """``Class.method`` for a method (its class found in the source), else the name."""
    lines = linecache.getlines(filename)
    if not lines or not 0 < lineno <= len(lines):
        return co_name
    line = lines[lineno - 1]
    indent = len(line) - len(line.lstrip())
    for prev in reversed(lines[: lineno - 1]):
        stripped = prev.lstrip()
        if not stripped or stripped.startswith(("#", "@")):
            continue
        depth = len(prev) - len(stripped)
        if depth < indent:
            m = re.match(r"class\s+(\w+)", stripped)
            return f"{m[1]}.{co_name}" if m else co_name
    return co_name


def _in_gt() -> bool:
    """Whether gt's own code runs here: its in-process worker, or one of its compile threads."""
    return _stance.in_worker.active or threading.current_thread().name.startswith("gt-")


class _Tap(logging.Filter):
    """Hands a logger's records to a handler; drops those it turned into events."""

    def __init__(self, handle, passthrough: bool = False):
        super().__init__()
        self.handle, self.passthrough = handle, passthrough

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            used = not _in_gt() and self.handle(record)  # gt's own compiles log as before
        except Exception:  # a diagnostics bug must never break the user's compile
            used = False
        return self.passthrough or not used


class _Watcher:
    """The state of one diagnostics block: hooks in place, what was seen so far."""

    def __init__(self, log: ev.EventLog):
        self.log = log
        self.lock = threading.RLock()
        self.names: dict[str, str] = {}  # frame id -> display name
        self.by_code: dict[tuple, str] = {}  # (file, co_name) -> display name
        self.last_fn = "?"
        self.done: set[int] = set()  # ids of metrics records handled
        self.kept: list = []  # ...kept alive, so that no new record can reuse their ids
        self.breaks: dict[str, list[dict]] = {}  # compile id -> graph breaks logged
        self.limits: set[str] = set()  # frame ids whose limit hit is reported
        self.skips_logged: set[str] = set()  # compile ids whose cudagraph skip was logged
        self.failures: set[str] = set()
        self.undo: list = []
        self.skips_seen = 0
        self.utils = None  # torch._dynamo.utils, once started

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
            from torch._dynamo import utils

            self.utils = utils
            self.kept = utils.get_compilation_metrics()
            self.done = {id(m) for m in self.kept}
            self.skips_seen = utils.counters["inductor"]["cudagraph_skips"]
        except Exception as exc:
            self.utils = None
            self.unavailable("torch._dynamo.utils compilation metrics", exc)
            return
        self._hook_metrics()
        self._tap(
            "torch._dynamo.symbolic_convert.__graph_breaks",
            self.on_break_log,
            "graph_breaks",
            debug=True,
        )
        self._tap("torch._dynamo.convert_frame", self.on_limit_log)
        # Dynamo also warns about .item() breaks on its own: the graph-break event says it all.
        self._tap("torch._dynamo.variables.tensor", lambda r: "Graph break" in r.getMessage())
        self._tap("torch._inductor.cudagraph_utils.__cudagraphs", self.on_skip_log, "cudagraphs")
        try:
            cm = _stance.hooked()
            cm.__enter__()
            self.undo.append(lambda: cm.__exit__(None, None, None))
        except Exception as exc:
            self.unavailable(
                "torch._dynamo.eval_frame._callback_from_stance (names of modules)", exc
            )

    def stop(self) -> None:
        try:
            self.sweep()
        finally:
            for undo in reversed(self.undo):
                with contextlib.suppress(Exception):
                    undo()
            self.undo.clear()

    def _hook_metrics(self) -> None:
        utils = self.utils
        original = getattr(utils, "log_compilation_event", None)
        if original is None:
            self.unavailable(
                "torch._dynamo.utils.log_compilation_event (live compile events)",
                KeyError("log_compilation_event"),
            )
            return

        def log_compilation_event(metrics):
            with contextlib.suppress(Exception):
                self.on_metrics(metrics)
            return original(metrics)

        utils.log_compilation_event = log_compilation_event
        self.undo.append(lambda: setattr(utils, "log_compilation_event", original))

    def _tap(self, name: str, handle, artifact: str | None = None, debug: bool = False) -> None:
        """Filter logger ``name`` through ``handle``; ``debug``: enable its DEBUG records."""
        logger = logging.getLogger(name)
        passthrough = False
        if artifact is not None:
            try:
                from torch._logging._internal import log_state

                passthrough = log_state.is_artifact_enabled(artifact)  # the user asked for it
            except Exception:
                pass
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
    def _ours(self, m) -> bool:
        """A compile of gt's own (its in-process worker, its compile threads, its code)."""
        f = m.co_filename or ""
        return _in_gt() or (f.startswith(_GT_DIR) and not f.startswith(_EXAMPLES))

    def _name(self, m, frame: str) -> str:
        co, f = m.co_name, m.co_filename or ""
        if co is None:  # a failed compile (the recompile limit): named by its frame's compiles
            return self.names.get(frame, self.last_fn)
        resume = _RESUME.match(co)
        if resume:
            name = self.by_code.get((f, resume["fn"]), resume["fn"])
        elif f.replace("\\", "/").endswith("_dynamo/external_utils.py"):
            name = _stance.entry_name() or "module"  # a torch.nn module, wrapped by Dynamo
        else:
            name = _qualname(co, f, m.co_firstlineno or 0)
            if name.endswith(".forward"):  # torch.compile(model): named by its class
                name = name[: -len(".forward")]
            self.by_code[(f, co)] = name
        self.names[frame] = name
        return name

    def on_metrics(self, m) -> None:
        with self.lock:
            if id(m) in self.done:
                return
            self.done.add(id(m))
            self.kept.append(m)
            if self._ours(m):
                return
            cid = str(m.compile_id)
            frame = cid.split("/")[0]
            fn = self._name(m, frame)
            self.last_fn = fn
            if m.fail_type:
                self._failed(m, fn, cid, frame)
            else:
                self._compiled(m, fn, cid)
            self._flush_breaks(cid, fn, m)
            self._cudagraph_skips(m, fn, cid)
            if not m.fail_type:
                self._budget(m, fn)

    def _compiled(self, m, fn: str, cid: str) -> None:
        total = m.entire_frame_compile_time_s
        backend = m.backend_compile_time_s
        inductor = m.inductor_compile_time_s
        if inductor is None and m.inductor_cumulative_compile_time_us is not None:
            inductor = m.inductor_cumulative_compile_time_us / 1e6
        aot = m.aot_autograd_cumulative_compile_time_us
        self.emit(
            ev.USER_COMPILE,
            function=fn,
            frame=m.co_name,
            compile_id=cid,
            where=f"{m.co_filename}:{m.co_firstlineno}",
            recompile=bool(m.recompile_reason),
            resume=bool(m.co_name and _RESUME.match(m.co_name)),
            seconds=total,
            dynamo_s=None if total is None else max(total - (backend or 0.0), 0.0),
            aot_s=None if aot is None else max(aot / 1e6 - (inductor or 0.0), 0.0),
            inductor_s=inductor,
            backend_s=backend,
            graphs=1 if m.graph_op_count else 0,
            ops=m.graph_op_count or 0,
            guards=m.guard_count,
            graph_breaks=m.num_graph_breaks or 0,
            cache_size=m.cache_size,
        )
        if m.recompile_reason:
            where, source = _where(m.recompile_reason)
            self.emit(
                ev.USER_RECOMPILE,
                function=fn,
                compile_id=cid,
                reason=short_reason(m.recompile_reason),
                where=where,
                source=source,
                raw=m.recompile_reason,
            )

    def _failed(self, m, fn: str, cid: str, frame: str) -> None:
        reason = m.fail_reason or ""
        if "recompile limit exceeded" in reason or "Limit type:" in reason:
            if frame not in self.limits:
                self.limits.add(frame)
                kind = re.search(r"Limit type: (\w+)", reason)
                kind = kind[1] if kind else "recompile_limit"
                self._limit(fn, cid, kind, recompile_limit(kind), m.recompile_reason or "")
            return
        kind = "error_on_recompile" if m.fail_type == "RecompileError" else "compile_error"
        if m.fail_type == "Unsupported":  # fullgraph=True: the graph break raised
            kind = "fullgraph"
            where = m.fail_user_frame_filename or ""
            where = f"{where}:{m.fail_user_frame_lineno}" if where else ""
            brk = {"reason": short_reason(reason), "where": where, "detail": reason[:1000]}
            self.breaks.setdefault(cid, [brk])
        key = f"{kind}:{cid}"
        if key not in self.failures:
            self.failures.add(key)
            self.emit(
                ev.USER_FAILURE,
                function=fn,
                compile_id=cid,
                kind=kind,
                reason=f"{m.fail_type}: {reason}",
            )

    def _limit(self, fn, cid, limit_type, limit, last_reason) -> None:
        where, source = _where(last_reason)
        self.emit(
            ev.USER_LIMIT_HIT,
            function=fn,
            compile_id=cid,
            limit_type=limit_type,
            limit=limit,
            last_reason=short_reason(last_reason),
            where=where,
            source=source,
            reason=f"hit config.{limit_type} ({limit}): {fn} runs eagerly from now on",
        )

    def _budget(self, m, fn: str) -> None:
        limit = recompile_limit()
        used = (m.cache_size or 0) + 1
        if m.recompile_reason and used >= max(2, _BUDGET_SHARE * limit):
            self.emit(
                ev.USER_BUDGET,
                function=fn,
                used=used,
                limit=limit,
                message=budget_message(fn, used, limit),
            )

    def on_break_log(self, record: logging.LogRecord) -> bool:
        import torch

        msg = record.getMessage()
        loc = re.search(r"in user code at (.+?):(\d+)", msg)
        body = msg.split("Graph Break Reason:", 1)[-1].split("\nUser code traceback:", 1)[0].strip()
        cid = torch._guards.CompileContext.current_compile_id()
        brk = {
            "reason": short_reason(msg),
            "where": f"{loc[1]}:{loc[2]}" if loc else "",
            "detail": body[:1000],
        }
        with self.lock:
            self.breaks.setdefault(str(cid) if cid is not None else "?", []).append(brk)
        return True

    def _flush_breaks(self, cid: str, fn: str, m) -> None:
        logged = self.breaks.pop(cid, None)
        if logged is None:  # no log record: the reasons from the metrics, without a place
            logged = [
                {"reason": short_reason(r), "where": "", "detail": r[:1000]}
                for r in sorted(m.restart_reasons or ())
                if "recompile limit" not in r
            ]
        for b in logged:
            self.emit(ev.USER_GRAPH_BREAK, function=fn, compile_id=cid, **b)

    def on_limit_log(self, record: logging.LogRecord) -> bool:
        import torch

        m = _LIMIT.search(record.getMessage())
        if m is None:
            return False
        cid = torch._guards.CompileContext.current_compile_id()
        cid = str(cid) if cid is not None else "?"
        frame = cid.split("/")[0]
        with self.lock:
            fn = self.names.get(frame) or m["fn"]
            if frame not in self.limits:
                self.limits.add(frame)
                self._limit(fn, cid, m["type"], int(m["limit"]), m["reason"].strip())
        return True

    def on_skip_log(self, record: logging.LogRecord) -> bool:
        import torch

        msg = record.getMessage()
        if "cudagraph" not in msg:
            return False
        cid = torch._guards.CompileContext.current_compile_id()
        with self.lock:
            fn = self.last_fn
            frames = _USER_FRAME.findall(msg)
            if frames:
                fn = self.by_code.get((frames[-1][0], frames[-1][2]), frames[-1][2])
            elif cid is not None:
                fn = self.names.get(str(cid).split("/")[0], fn)
            if cid is not None:
                self.skips_logged.add(str(cid))
            self.skips_seen += 1  # this skip bumps the counter right after logging
            self.emit(
                ev.USER_CUDAGRAPH_SKIP,
                function=fn,
                compile_id=str(cid or ""),
                reason=msg.strip()[:500],
                logged=True,
            )
        return True

    def _cudagraph_skips(self, m, fn: str, cid: str) -> None:
        if m.cudagraph_skip_reason and cid not in self.skips_logged:
            self.skips_logged.add(cid)
            self.skips_seen += 1
            self.emit(
                ev.USER_CUDAGRAPH_SKIP,
                function=fn,
                compile_id=cid,
                reason=m.cudagraph_skip_reason,
                logged=True,
            )
        self._counted_skips(fn, cid)

    def _counted_skips(self, fn: str, cid: str) -> None:
        if self.utils is None:
            return
        now = self.utils.counters["inductor"]["cudagraph_skips"]
        if now > self.skips_seen:
            n, self.skips_seen = now - self.skips_seen, now
            self.emit(
                ev.USER_CUDAGRAPH_SKIP,
                function=fn,
                compile_id=cid,
                count=n,
                logged=False,
                reason=f"cudagraphs skipped {n} time(s), no reason logged "
                "(counters['inductor']['cudagraph_skips']; on CPU there are no CUDA graphs)",
            )

    def sweep(self) -> None:
        """Records the live hook missed, breaks without a record, skips counted since."""
        if self.utils is None:
            return
        for m in self.utils.get_compilation_metrics():
            self.on_metrics(m)
        with self.lock:
            for cid, breaks in list(self.breaks.items()):
                fn = self.names.get(cid.split("/")[0], self.last_fn)
                for b in breaks:
                    self.emit(ev.USER_GRAPH_BREAK, function=fn, compile_id=cid, **b)
            self.breaks.clear()
            self._counted_skips(self.last_fn, "")

    def on_error(self, exc: BaseException) -> None:
        """A strict stance turned a recompile into an error: say so (the error still raises)."""
        text = str(exc)
        if "fail_on_recompile" not in text and type(exc).__name__ != "RecompileError":
            return
        with self.lock:
            stance = re.search(r"filename: '([^']+)', function name: '([^']+)'", text)
            config = re.search(r"Recompiling function (\S+) in (.+?):\d+", text)
            file, name = (
                (stance[1], stance[2]) if stance else (config[2], config[1]) if config else ("", "")
            )
            fn = self.by_code.get((file, name), name) if name else self.last_fn
            kind = "fail_on_recompile" if "fail_on_recompile" in text else "error_on_recompile"
            if any(k.startswith(kind) for k in self.failures):
                return
            self.failures.add(f"{kind}:exit")
            guard = (
                text.split("guard failure(s):", 1)[-1].strip().lstrip("- ")
                if "guard failure" in text
                else ""
            )
            self.emit(
                ev.USER_FAILURE,
                function=fn,
                kind=kind,
                reason=text[:2000],
                guard=short_reason(guard),
            )
