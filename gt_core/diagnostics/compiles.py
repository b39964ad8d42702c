"""Compiles and what stops them: ``user.compile``, ``user.recompile``, ``user.failure``,
``user.limit_hit`` and ``user.budget`` events, from compile records, the recompile-limit
warning and the error a strict stance raises."""

from __future__ import annotations

import json
import logging
import re

from gt_core.diagnostics import torch_hooks as hooks
from gt_core.diagnostics.names import last_user_frame
from gt_core.observe import events as ev
from gt_core.observe.causes import budget_message, short_reason

__all__ = ["CompileEvents"]

_LIMIT = re.compile(
    r"hit config\.(?P<type>\w+) \((?P<limit>\d+)\)\s+function: '(?P<fn>[^']+)' \((?P<where>[^)]*)\)"
    r"\s+last reason: (?P<reason>.*?)(?:\nTo log all|\Z)",
    re.S,
)
_BUDGET_SHARE = 0.75  # warn once this share of the recompile limit is used


def _automatic_dynamic(m) -> bool | None:
    """Whether the compile ran with automatic dynamic shapes (off under ``dynamic=False``):
    a size that changed is then compiled dynamic, unless the code needs it as an int."""
    try:
        return bool(json.loads(m.dynamo_config)["automatic_dynamic_shapes"])
    except Exception:  # no config recorded: unknown
        return None


class CompileEvents:
    """Compile, recompile, failure, limit and budget events; each limit hit and failure once."""

    def __init__(self, emit, names, breaks):
        self.emit, self.names, self.breaks = emit, names, breaks
        self.limits: set[str] = set()  # frame ids whose limit hit is reported
        self.failures: set[str] = set()
        self.functions: set[str] = set()  # the names of the functions compiled
        self.causes: dict[str, list[dict]] = {}  # compile id -> every failing guard found

    def checked(self, cid: str, causes: list[dict]) -> None:
        """A recompile's every failing guard, found before its compile record is made."""
        self.causes[cid] = causes

    def compiled(self, m, fn: str, cid: str) -> None:
        self.functions.add(fn)
        if getattr(m, "is_forward", None) is False:  # AOT autograd's backward, at a first backward
            us = m.backward_cumulative_compile_time_us
            self.emit(
                ev.USER_COMPILE,
                function=fn,
                compile_id=cid,
                backward=True,
                seconds=None if us is None else us / 1e6,
            )
            return
        causes = self.causes.pop(cid, [])
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
            resume=bool(m.co_name and hooks.RESUME.match(m.co_name)),
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
            specialize_float=m.specialize_float,
        )
        if m.recompile_reason:
            where, source = last_user_frame(m.recompile_reason)
            self.emit(
                ev.USER_RECOMPILE,
                function=fn,
                compile_id=cid,
                reason=short_reason(m.recompile_reason),
                where=where,
                source=source,
                raw=m.recompile_reason,
                specialize_float=m.specialize_float,
                automatic_dynamic=_automatic_dynamic(m),
                causes=causes,
            )

    def failed(self, m, fn: str, cid: str, frame: str) -> None:
        reason = m.fail_reason or ""
        self.causes.pop(cid, None)
        if "recompile limit exceeded" in reason or "Limit type:" in reason:
            if frame not in self.limits:
                self.limits.add(frame)
                kind = re.search(r"Limit type: (\w+)", reason)
                kind = kind[1] if kind else "recompile_limit"
                limit = hooks.recompile_limit(kind)
                self._limit(fn, cid, kind, limit, m.recompile_reason or "")
            return
        kind = "error_on_recompile" if m.fail_type == "RecompileError" else "compile_error"
        if m.fail_type == "Unsupported" and self.breaks.skipped(cid):
            return  # a break it could not resume from: the function runs eagerly, its break says
        if m.fail_type == "Unsupported":  # fullgraph=True: the graph break raised
            kind = "fullgraph"
            self.breaks.raised(m, cid, reason)
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
        where, source = last_user_frame(last_reason)
        self.emit(
            ev.USER_LIMIT_HIT,
            function=fn,
            compile_id=cid,
            limit_type=limit_type,
            limit=limit,
            last_reason=short_reason(last_reason),
            where=where,
            source=source,
            reason=f"hit config.{limit_type} ({limit}): {fn} compiles no new graph; calls that "
            "need one run eagerly",
        )

    def budget(self, m, fn: str) -> None:
        limit = hooks.recompile_limit()
        used = (m.cache_size or 0) + 1
        if m.recompile_reason and used >= max(2, _BUDGET_SHARE * limit):
            self.emit(
                ev.USER_BUDGET,
                function=fn,
                used=used,
                limit=limit,
                message=budget_message(fn, used, limit),
            )

    def on_limit_log(self, record: logging.LogRecord) -> bool:
        m = _LIMIT.search(record.getMessage())
        if m is None:
            return False
        cid = hooks.current_compile_id() or "?"
        frame = cid.split("/")[0]
        fn = self.names.of_frame(frame, m["fn"])
        if frame not in self.limits:
            self.limits.add(frame)
            self._limit(fn, cid, m["type"], int(m["limit"]), m["reason"].strip())
        return True

    def on_error(self, exc: BaseException) -> None:
        """A strict stance turned a recompile into an error: say so (the error still raises)."""
        text = str(exc)
        if "fail_on_recompile" not in text and type(exc).__name__ != "RecompileError":
            return
        stance = re.search(r"filename: '([^']+)', function name: '([^']+)'", text)
        config = re.search(r"Recompiling function (\S+) in (.+?):\d+", text)
        file, name = (
            (stance[1], stance[2]) if stance else (config[2], config[1]) if config else ("", "")
        )
        fn = self.names.of_code(file, name) if name else self.names.last
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
