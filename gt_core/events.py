"""Events: plain, JSON-able dicts that carry everything observable from worker to client to UI.

Every event has ``type`` (one of the constants below) and ``t`` (seconds since the epoch).
Producers call :func:`event`; the client's :class:`EventLog` keeps them, writes them to the
instruction log when one is configured, and hands them to listeners (the dashboard).
This module does not import torch: widgets and offline log viewers read the same data.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["event", "EventLog", "load_log", "TYPES"]

# Hot paths (published by the worker)
RECORDING = "hotpath.recording"  # signature, ops, n_ops, signal (a signal's block, seen once)
DETECTED = "hotpath.detected"  # signature, ops, n_ops, occurrences, similar_to
COMPILE_STARTED = "compile.started"  # signature, backend, mode, where ("process" | "thread" | "inline")
COMPILE_FINISHED = "compile.finished"  # signature, seconds[, cudagraphs, cudagraph_skips]
COMPILE_FAILED = "compile.failed"  # signature, reason
RECOMPILE = "recompile"  # signature, previous, reason
FALLBACK = "fallback"  # signature, reason (a compiled run failed; eager from now on)
REVERT = "revert"  # signature, reason, eager_ms, compiled_ms
MISMATCH = "mismatch"  # signature, position, expected, got
ITERATION = "iteration"  # signature, kind ("eager" | "compiled" | "compiling"), ms
SIGNAL = "signal"  # name, phase ("enter" | "exit")
JIT = "jit"  # function, name, state ("replaying" | "refused"), signature, reason, frozen, ...
JIT_STATS = "jit.stats"  # function, name, signature, replayed, recorded, client_ms (cumulative)
PLAN = "hotpath.plan"  # signature, plan (a gt_core._plan.Plan, or None to withdraw it): for the client's matcher, never logged
# Worker lifecycle and client statistics
WORKER = "worker"  # state ("started" | "died" | "stopped"), pid, device, cause
STATS = "stats"  # ops, frees, syncs, uploads (client counters, cumulative)
ERROR = "worker.error"  # error, message, notes, where: a worker error raised to the user
# The user's own torch.compile calls (published by gt_core.diagnostics)
USER_COMPILE = "user.compile"
USER_RECOMPILE = "user.recompile"
USER_GRAPH_BREAK = "user.graph_break"
USER_LIMIT_HIT = "user.limit_hit"
USER_CUDAGRAPH_SKIP = "user.cudagraph_skip"
USER_FAILURE = "user.failure"  # function, kind ("fail_on_recompile", "unavailable", ...), reason
USER_BUDGET = "user.budget"  # function, used, limit, message ("kv_step: 6 of 8 recompiles used")
USER_ROUTED = "user.routed"  # function, message (called inside capture: ran through gt's stream)

TYPES = frozenset(v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str))


def event(type: str, **fields) -> dict:
    """A new event of ``type`` stamped with the current time."""
    return {"type": type, "t": time.time(), **fields}


class EventLog:
    """The client's record of events: thread-safe, optionally mirrored to a JSON-lines file."""

    def __init__(self, path: str | os.PathLike | None = None):
        self._events: list[dict] = []
        self._lock = threading.Lock()
        self._listeners: list[Callable[[list[dict]], None]] = []
        self._file = None
        self.path = None
        if path:
            self.open(path)

    def open(self, path: str | os.PathLike) -> None:
        """Append every later event to ``path`` as one JSON line."""
        self.close()
        f = open(os.fspath(path), "a", encoding="utf-8")  # noqa: SIM115 (kept open on purpose)
        self.path, self._file = os.fspath(path), f

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self.path = None

    def extend(self, events: Iterable[dict]) -> None:
        events = list(events)
        if not events:
            return
        with self._lock:
            self._events.extend(events)
            if self._file is not None:
                self._file.write("".join(json.dumps(e, default=str) + "\n" for e in events))
                self._file.flush()
            listeners = list(self._listeners)
        for listener in listeners:
            listener(events)

    def emit(self, type: str, **fields) -> dict:
        e = event(type, **fields)
        self.extend([e])
        return e

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def clear(self) -> None:
        with self._lock:
            self._events.clear()

    def subscribe(self, listener: Callable[[list[dict]], None]) -> Callable[[], None]:
        """Call ``listener(new_events)`` on every extension; returns the unsubscribe function."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe


def load_log(path: str | os.PathLike) -> list[dict]:
    """Read an instruction log written by :class:`EventLog` (one JSON event per line)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                e = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON event ({exc.msg}); expected one JSON object per line") from None
            if not isinstance(e, dict) or "type" not in e:
                raise ValueError(f"{path}:{n}: expected an object with a 'type' field, got {line[:80]!r}")
            out.append(e)
    return out
