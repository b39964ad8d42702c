"""Events: plain, JSON-able dicts that carry everything observable from worker to client to UI.

Every event has ``type`` (one of the constants below) and ``t`` (seconds since the epoch).
Producers call :func:`event`; the client's :class:`EventLog` keeps them, writes them to the
instruction log when one is configured, and hands them to listeners (the dashboard).

Memory stays bounded over long runs: the events that come once per step (``iteration``,
``mismatch``, ``stats``) are kept one by one for the first ``head`` and the last ``tail`` of
each series (type and signature); those in between are folded into one ``folded`` event per
series and view, which counts them (by kind) and sums their milliseconds. Counts and totals
stay exact; medians are over the runs kept. The instruction log file gets every event.
This module does not import torch: widgets and offline log viewers read the same data.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

__all__ = ["event", "EventLog", "load_log", "TYPES"]

# Hot paths (published by the worker)
RECORDING = "hotpath.recording"  # signature, ops, n_ops, signal (a signal's block, seen once)
# signature, ops, n_ops, occurrences, recording_t, canonical, values, op_ms (ms per entry)
DETECTED = "hotpath.detected"
# the detected event's fields but occurrences and recording_t, and status (its state now): a
# block known from before reset(), at its first run since
KNOWN = "hotpath.known"
# signature, status (the state entered), was, why (the lifecycle table's words for the move:
# gt_core.observe.status.TRANSITIONS): every move of a hot path on the worker, emitted as it
# is made; the report's status is these moves applied (observe.fold), after its detection
STATE = "hotpath.state"
COMPILE_STARTED = (
    "compile.started"  # signature, backend, mode, dynamic, where ("process" | "thread" | "inline")
)
# signature, seconds, code {fx, generated}, phases {name: seconds}, cache ("hit" | "miss" |
# "kept": loaded from gt's block cache |
# None)[, cudagraphs, cudagraph_skips]
COMPILE_FINISHED = "compile.finished"
COMPILE_FAILED = "compile.failed"  # signature, reason
# signature, reason, seconds: its hot path was retired while it compiled, so the compile was
# stopped (the cores go back to the loop); it compiles again if it runs again
COMPILE_CANCELLED = "compile.cancelled"
CACHE_EVICTED = "compile.cache_evicted"  # signature, files, reason: damaged, removed, recompiled
RECOMPILE = "recompile"  # signature, previous, reason
FALLBACK = "fallback"  # signature, reason (a compiled run failed; eager from now on)
# signature, reason, eager_ms, compiled_ms, runs (since its compiled function came: what
# settling took; also on CHECK_FAILED and KEPT)
REVERT = "revert"
CHECKED = "hotpath.checked"  # signature, diff, what, tolerance (or skipped: why not checked)
CHECK_FAILED = "hotpath.check_failed"  # signature, reason, what, diff, tolerance, runs: reverted
KEPT = "hotpath.kept"  # signature, eager_ms, compiled_ms, runs: a regression check kept it compiled
# signature, reason, by (the longer hot path that runs its instructions, or None): matched no
# more, for good (the report's status "retired")
RETIRED = "hotpath.retired"
# signature, reason, status (its state, compiled say): a retired block matched again, its own
# period found outside the longer block that ran it
REVIVED = "hotpath.revived"
NOTE = "hotpath.note"  # signature, reason: what some of its runs did (said once per block)
MISMATCH = "mismatch"  # signature, position, expected, got
ITERATION = "iteration"  # signature, kind ("eager" | "compiled" | "compiling"), ms
SIGNAL = "signal"  # name, phase ("enter" | "exit")
JIT = "jit"  # function, name, state, trigger (observe.jit_states), signature, reason, cause
JIT_STATS = "jit.stats"  # function, name, signature, replayed, client_ms (cumulative)
# syncs, uploads: {"file:line": n} since the session started (the explorer's Source tab)
CLIENT_LINES = "client.lines"
CLIENT_STATS = "client.stats"  # signature, runs, client_ms: the client's ms per occurrence
SITES = "hotpath.sites"  # signature, entries: per canonical entry {source, text, module, phase, optimizer} or None
PLAN = "hotpath.plan"  # signature, plan (a gt_core.stream.plan.Plan, or None to withdraw it): for the client's matcher, never logged
# Worker lifecycle and client statistics
WORKER = "worker"  # state ("started" | "died" | "stopped"), pid, device, cause
GROUP = "worker.group"  # rank, world, agreements, comm, pid: a worker group's rank, as it starts and agrees
# comm: a rank's collectives so far, {kind: (count, bytes)} (gt_core.worker_process.comms); a worker
# group's iteration events carry it too, so that each step's collectives are known
SHARDED = "worker.sharded"  # op, reason: an op of sharded values ran replicated (said once per op)
# rank, world, pid, runs {kind: n}, compiled [sig], step_ms, collectives (all kinds, so far),
# comm {kind: (count, bytes)} (so far), comm_step {kind: (count, bytes)} (a step's),
# placements {p: n}, replicated {op: why}
RANK = "worker.rank"
# ops, frees, syncs, uploads, fetches, bytes_up, up_ms, bytes_down, down_ms: the client's
# counters, cumulative (gt_core.observe.report.COUNTERS); base: a log's start
STATS = "stats"
# dataset, rows, ops: a DataLoader batch recorded an op a row or more on the worker (rows of
# worker tensors indexed one by one), said once per dataset class
DATA_ROWS = "data.rows"
ERROR = "worker.error"  # error, message, notes, where: a worker error raised to the user
# The user's own torch.compile calls (published by gt_core.diagnostics)
USER_COMPILE = "user.compile"
USER_RECOMPILE = "user.recompile"
USER_GRAPH_BREAK = "user.graph_break"
USER_LIMIT_HIT = "user.limit_hit"
USER_CUDAGRAPH_SKIP = "user.cudagraph_skip"
USER_FAILURE = "user.failure"  # function, kind ("fail_on_recompile", "unavailable", ...), reason
USER_BUDGET = "user.budget"  # function, used, limit, message ("kv_step: 6 of the 8 graphs ...")
USER_ROUTED = "user.routed"  # function, message (called inside capture: ran through gt's stream)
# function, entries [{compile_id, code, guards}]: its cache entries as the block ends (each
# entry's own guards, whole), what the explanations check their words against
USER_ENTRIES = "user.entries"
# function, calls, outcomes {compiled, compiling, eager, partly_eager, eager_sample, raised: n},
# median_ms {outcome: ms}, samples, speedup (eager / compiled on the same inputs), compared,
# eager_every: a snapshot of its calls so far (gt_core.diagnostics.calls), the latest wins
USER_CALLS = "user.calls"
# function, backward, phase (in words; "done" at its end), seconds so far, cache (inductor's
# FX graph cache: "hit", "miss" or None while unknown), done: a compile under way
# (gt_core.diagnostics.progress), published about every second while it runs
USER_COMPILING = "user.compiling"
# The client's log: per-step events it no longer keeps one by one (never sent, never logged)
FOLDED = "folded"  # of (a type), signature, n, counts {key: n}, totals {key: sum}, last (event)

TYPES = frozenset(v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str))
VERDICTS = frozenset((REVERT, KEPT))  # a regression check's, with the medians it compared
FORMS = frozenset((DETECTED, KNOWN))  # the events that say what a block is (its form, graph)

# What a fold keeps of each per-step type: counts by this field, sums of that one.
_FOLDS = {
    ITERATION: ("kind", "ms"),
    MISMATCH: ("got", None),
    STATS: (None, None),
    JIT_STATS: (None, None),
    CLIENT_STATS: (None, None),
}
HEAD = 1000  # events of a series kept from its start (the eager baseline, the compile)
TAIL = 1000  # and from its end (the steady state the medians read)


_KERNEL: list = []  # the kernel's one EventLog, made on first use


def kernel_log() -> EventLog:
    """The kernel's EventLog: every event of this process since the last reset (gt_core's
    events_log(); diagnostics write to it too)."""
    if not _KERNEL:
        _KERNEL.append(EventLog())
    return _KERNEL[0]


def event(type: str, **fields) -> dict:
    """A new event of ``type`` stamped with the current time."""
    return {"type": type, "t": time.time(), **fields}


class EventLog:
    """The client's record of events: thread-safe, bounded, optionally mirrored to a file.

    ``len(log)`` counts the events received (the arrival number of the next one); a view
    that starts at ``mark()`` never shares a fold with what came before it.
    """

    def __init__(
        self, path: str | os.PathLike | None = None, *, head: int = HEAD, tail: int = TAIL
    ):
        if head < 0 or tail < 1:
            raise ValueError(f"EventLog: expected head >= 0 and tail >= 1, got {head=} {tail=}")
        self.head, self.tail = head, tail
        self._events: list[dict] = []  # kept events and folds, in arrival order
        self._seq: list[int] = []  # arrival number of each (a fold: its first event's)
        self._received = 0
        self._marks: list[int] = []  # arrival numbers where views start
        self._series: dict[tuple, _Series] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[list[dict]], None]] = []
        self._file = None
        self.path = None
        if path:
            self.open(path)

    def open(self, path: str | os.PathLike) -> None:
        """Append every later event to ``path`` as one JSON line.

        The client's counters are cumulative: the file starts with their values now (a
        ``stats`` event marked ``base``), so a report of the file counts what it saw.
        """
        self.close()
        f = open(os.fspath(path), "a", encoding="utf-8")  # noqa: SIM115 (kept open on purpose)
        with self._lock:
            last = next((_stats(e) for e in reversed(self._events) if _stats(e)), None)
            if last is not None:
                base = {**event(STATS, **_counters(last)), "base": True}
                f.write(json.dumps(base, default=str) + "\n")
                f.flush()
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
            for e in events:
                self._keep(e)
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

    def mark(self) -> int:
        """Start a view here: returns the arrival number to pass to :meth:`view`."""
        with self._lock:
            if not self._marks or self._marks[-1] != self._received:
                self._marks.append(self._received)
            return self._received

    def snapshot(self) -> list[dict]:
        with self._lock:
            return [_copy(e) if e["type"] == FOLDED else e for e in self._events]

    def view(self, start: int) -> tuple[list[dict], int]:
        """The snapshot, and the index in it of the first event received at ``start`` or later."""
        with self._lock:
            events = [_copy(e) if e["type"] == FOLDED else e for e in self._events]
            return events, bisect.bisect_left(self._seq, start)

    def __len__(self) -> int:
        return self._received

    def clear(self) -> None:
        with self._lock:
            self._events.clear()
            self._seq.clear()
            self._marks.clear()
            self._series.clear()
            self._received = 0

    # -- the bound ---------------------------------------------------------------------------
    def _keep(self, e: dict) -> None:
        seq = self._received
        self._received += 1
        self._events.append(e)
        self._seq.append(seq)
        rule = _FOLDS.get(e.get("type"))
        if rule is None:
            return
        key = (e["type"], e.get("signature"))
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = _Series()
        s.seen += 1
        if s.seen <= self.head:
            return
        s.tail.append(seq)
        if len(s.tail) > self.tail:
            self._fold(s, s.tail.popleft(), rule)

    def _fold(self, s: _Series, seq: int, rule: tuple) -> None:
        """Fold the kept event that arrived at ``seq`` into its series' open fold."""
        i = bisect.bisect_left(self._seq, seq)
        e = self._events[i]
        by, total = rule
        f = s.fold
        marks = self._marks
        if f is not None and bisect.bisect_right(marks, s.fold_seq) == bisect.bisect_right(
            marks, seq
        ):
            del self._events[i], self._seq[i]  # no view starts between: one fold
        else:
            f = s.fold = {"type": FOLDED, "t": e.get("t"), "of": e["type"], "n": 0}
            if e.get("signature") is not None:
                f["signature"] = e["signature"]
            f["counts"], f["totals"] = {}, {}
            s.fold_seq = seq
            self._events[i] = f
        f["n"] += 1
        f["last"] = e
        if by is not None:
            k = e.get(by)
            f["counts"][k] = f["counts"].get(k, 0) + 1
            if total is not None:
                f["totals"][k] = f["totals"].get(k, 0.0) + e.get(total, 0.0)

    def subscribe(self, listener: Callable[[list[dict]], None]) -> Callable[[], None]:
        """Call ``listener(new_events)`` on every extension; returns the unsubscribe function."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe


class _Series:
    """One per-step series in the log: how many came, the kept tail, the open fold."""

    __slots__ = ("seen", "tail", "fold", "fold_seq")

    def __init__(self):
        self.seen = 0
        self.tail: deque[int] = deque()  # arrival numbers of the kept events past the head
        self.fold: dict | None = None
        self.fold_seq = -1


def _stats(e: dict) -> dict | None:
    """The client's counters an event carries (a stats event, or a fold of them), or None."""
    if e.get("type") == STATS:
        return e
    if e.get("type") == FOLDED and e.get("of") == STATS:
        return e.get("last")
    return None


def _counters(e: dict) -> dict:
    return {k: v for k, v in e.items() if k not in ("type", "t", "base")}


def _copy(fold: dict) -> dict:
    """A fold as it is now (the log goes on adding to its own)."""
    return {**fold, "counts": dict(fold["counts"]), "totals": dict(fold["totals"])}


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
                raise ValueError(
                    f"{path}:{n}: not a JSON event ({exc.msg}); expected one JSON object per line"
                ) from None
            if not isinstance(e, dict) or "type" not in e:
                raise ValueError(
                    f"{path}:{n}: expected an object with a 'type' field, got {line[:80]!r}"
                )
            out.append(e)
    return out
