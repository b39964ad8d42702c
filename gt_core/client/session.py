"""The client's connection to one worker: ids, the pending batch, syncs, counters.

A session lives as long as its worker. Restarting the worker starts a new session, so a
proxy can tell whether the worker that holds its value still exists.

Every instruction goes through :meth:`Session.emit`, which sends it where the session's
:class:`Route` says. Once the worker has sent plans of its hot blocks, emit hands
instructions to the :class:`~gt_core.client.plans.plan_match.PlanMatcher`, which turns each
complete occurrence into one RUN and sends it at once (the worker runs step i while the
client records step i+1). Proxies that die only queue their id (``freed``): a free never
re-enters the matcher from a destructor; it joins the stream before the next instruction.
"""

from __future__ import annotations

import enum
import itertools
import linecache
import os
import threading
import time
import weakref
from collections import deque

from gt_core.client import collector
from gt_core.client.interrupt import check as check_interrupt
from gt_core.client.plans.early_sites import EarlySites
from gt_core.client.plans.plan_match import PlanMatcher
from gt_core.client.plans.sites import Lines
from gt_core.client.recording.mirror import Mirror
from gt_core.errors import WorkerDied, WorkerLost
from gt_core.observe import events as ev
from gt_core.options import Options
from gt_core.stream.instructions import (
    DEFOP,
    FREE,
    DefOp,
    Free,
    defining_module,
    new,
    qualified_name,
)
from gt_core.stream.requests import Fetch

__all__ = ["Session", "Route", "LOCK", "live_session", "set_live_session"]


_generations = itertools.count(1)
# Every change to a session's stream (an op recorded, a request, a flush) holds this lock:
# threads that use worker tensors at once take turns op by op, and the stream stays whole.
LOCK = threading.RLock()
_LIVE: list = []  # the accessor of the live session, set by client.capture (see live_session)
FORKED = [False]  # this process is a fork of the kernel (a DataLoader's worker process)
_SESSIONS: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader's worker process) inherits the kernel's capture and its
    sessions, pipes included: it must never write to them (the parent's worker reads those
    pipes; a factory the child recorded would land in the parent's stream). Its tensors are
    its own, plain ones (see client.mode)."""
    FORKED[0] = True
    for s in list(_SESSIONS):
        s.closed = True
        s.buf, s.freed = [], deque()


os.register_at_fork(after_in_child=_after_fork_in_child)


def set_live_session(accessor) -> None:
    """Where live_session finds the session: ``accessor()`` (client.capture's session())."""
    _LIVE[:] = [accessor]


def live_session() -> Session:
    """The session ops with no worker tensor go to (a factory inside a capture), a worker
    started if there is none: client.capture's session(), which knows the options."""
    return _LIVE[0]()


# What the client counts: ops recorded, frees, syncs; uploads and fetches, the bytes each moved,
# the client's ms copying them, and its ms waiting for the worker to read a full upload ring.
_COUNTERS = ("ops", "frees", "syncs", "shadow_reads", "uploads", "fetches")
_COUNTERS += ("bytes_up", "up_ms", "up_wait_ms", "bytes_down", "down_ms")
_SITES = 4096  # values whose recording line is remembered for errors (the newest)
_FOR_CLIENT = frozenset((ev.PLAN,))  # the client's own: never logged


class Route(enum.Enum):
    """Where the session's instructions go (Session.emit); only the session changes it."""

    JIT = "jit recording"  # out, and kept in the recording call's tee (jit: Session.record_into)
    SITES = "first-capture sites"  # kept with their sites as they go out (EarlySites)
    PLAN = "plan following"  # through the plan matcher: whole occurrences go as RUNs
    PLAIN = "plain"  # out as they are (a plan arriving makes it PLAN at the next instruction)


# (per op: a global each, not an attribute of the enum)
_ROUTE_JIT, _ROUTE_SITES, _ROUTE_PLAN, _ROUTE_PLAIN = Route


class Session:
    """Ids, the pending batch and the transport of one worker generation."""

    def __init__(self, options: Options, log: ev.EventLog):
        self.gen = next(_generations)
        self.options = options
        self.log = log
        self.said: set = set()  # what was said once (forgotten with the events: reset)
        self.buf: list = []
        self.freed: deque = deque()  # ids of proxies that died since the last instruction
        self._freeing = False  # in drain_frees: a full batch is sent, not flushed (see out)
        self.early = EarlySites()  # what the first capture records, sited
        self.matcher = PlanMatcher(self.out, self.send_now, Lines(log), self.early)
        self.transport = _transport_class(options)(options, self._on_events)
        self.transport.before_waiting(self.flush)  # (a full upload ring: see Transport)
        self.ids = itertools.count(1)  # the value ids to come: the per-op paths take next(ids)
        self.op_index: dict = {}
        self.closed = False
        self.dead: str | None = None  # why the worker died, once a send or a sync found out
        self.flush_at = options.flush_at
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self.sites: dict[int, tuple[str, int]] = {}  # value id -> (file, line) recording it
        # While a jit call records (record_into): its instructions (see out), its uploads,
        # each (value id, proxy, host copy or None, (file, line)), what it does on shadows.
        self.tee = self.tee_puts = self.shadow_log = None
        self.route = self._routed()
        self.jits: list = []  # gt_core.jit's cache entries of this session (their stats)
        self.stats_sent: dict = {}  # hot path or jit entry -> its count last published
        self.mirror = Mirror(self, LOCK)  # the kernel's generator state and default dtype, there
        _SESSIONS.add(self)

    def _on_events(self, events) -> None:
        """Events from the worker: plans go to the matcher, everything else to the log."""
        if any(e["type"] in _FOR_CLIENT for e in events):
            for e in events:
                if e["type"] == ev.PLAN and self.options.client_match:
                    collector.set_aside()  # (the step's objects: see collector)
                    self.matcher.offer(e["signature"], e["plan"])
            events = [e for e in events if e["type"] not in _FOR_CLIENT]
        if events:
            self.log.extend(events)

    def set_options(self, options: Options) -> None:
        """New options for this session (the caller has sent them to the worker)."""
        self.options = options
        self.flush_at = options.flush_at
        if not options.client_match:
            self.flush()
            self.matcher.forget()
            self.route = self._routed()

    # -- the route -----------------------------------------------------------------------
    def _routed(self) -> Route:
        """The route asked for: a jit call's tee first, the first capture's sites, plans."""
        if self.tee is not None:
            return _ROUTE_JIT
        if self.early.open:
            return _ROUTE_SITES
        return _ROUTE_PLAN if self.matcher.live else _ROUTE_PLAIN

    def record_into(self, tee: list, puts: list, shadow_log=None) -> None:
        """A jit call records: what is emitted from now goes out and into ``tee``, uploads
        into ``puts``, and reads of shadows into ``shadow_log`` (jit.program.ShadowLog)."""
        self.tee, self.tee_puts, self.shadow_log = tee, puts, shadow_log
        self.route = _ROUTE_JIT

    def stop_recording(self) -> None:
        """The jit call's block has ended: instructions go where they went before it."""
        self.tee = self.tee_puts = self.shadow_log = None
        self.route = self._routed()

    def end_capture(self) -> None:
        """A capture ended: the first capture's siting too (EarlySites.close)."""
        self.early.close()
        self.route = self._routed()

    # -- ids and ops ---------------------------------------------------------------------
    def new_ids(self, n: int) -> range:
        first = next(self.ids)
        self.ids = itertools.count(first + n)
        return range(first, first + n)

    def ids_from(self, end: int) -> None:
        """Ids below ``end`` are taken (the worker named a call's outputs from next_id on)."""
        self.ids = itertools.count(max(next(self.ids), end))

    @property
    def next_id(self) -> int:
        """The id the next value takes (none is taken)."""
        vid = next(self.ids)
        self.ids = itertools.count(vid)
        return vid

    def op(self, func) -> int:
        """The small integer naming ``func`` on this worker (defined on first use)."""
        idx = self.op_index.get(func)
        if idx is None:
            idx = self.op_index[func] = len(self.op_index)
            self.buf.append(DefOp(DEFOP, idx, qualified_name(func), defining_module(func)))
        return idx

    # -- the stream ----------------------------------------------------------------------
    def emit(self, ins, proxies=()) -> None:
        """Add one instruction to the stream (``proxies``: its tensor arguments, whose
        metadata the plan matcher checks)."""
        if self.freed:
            self.drain_frees()
        route = self.route
        if route is _ROUTE_PLAIN and self.matcher.live:  # plans came (the events thread's offer)
            route = self.route = _ROUTE_PLAN
        if route is _ROUTE_PLAN:
            self.matcher.feed(ins, proxies)
        elif route is _ROUTE_SITES:
            if not self.early.record(self.matcher, self.out, ins, proxies):
                self.route = self._routed()  # (its budget spent: nothing more is sited)
        else:
            self.out(ins)

    def out(self, ins) -> None:
        """Into the batch that goes out next (what the matcher lets through, too)."""
        buf = self.buf
        buf.append(ins)
        if self.tee is not None:
            self.tee.append(ins)
        if len(buf) >= self.flush_at:
            # Inside drain_frees, only the full batch goes: the loop there goes on with the frees
            # left (a flush would drain them, nested once per batch: a recursion as deep as
            # the frees are many, past Python's stack).
            if self._freeing:
                self.send_now()
            else:
                self.flush()

    def drain_frees(self) -> None:
        """The values freed since the last instruction join the stream (the matcher's, while
        it follows a plan), before the next instruction."""
        freed, matcher = self.freed, self.matcher
        self._freeing = True
        try:
            while freed:
                vid = freed.popleft()
                if self.early.open:
                    self.early.free(vid)
                if matcher.live and self.route is not _ROUTE_JIT:
                    matcher.free(vid)
                else:
                    self.out(new(Free, (FREE, vid)))
        finally:
            self._freeing = False

    def flush(self) -> None:
        """Send what is pending (an occurrence being matched goes out as instructions)."""
        with LOCK:
            if self.freed:
                self.drain_frees()
            if self.matcher.kept:
                self.matcher.release()
            self.send_now()

    def send_now(self) -> None:
        """Send the batch as it is: after a RUN, so the worker starts on it at once.

        (Not a flush: frees still pending are fed to the matcher later, in their order, and
        may already start the next occurrence; releasing that would send it op by op.)
        """
        if self.buf and not self.closed:
            batch, self.buf = self.buf, []
            try:
                self.transport.send(batch)
            except WorkerDied as exc:
                self.dead = str(exc)
                raise

    def stage(self, t):
        """What a PUT carries for the plain tensor ``t`` (a copy taken now: see Transport)."""
        t0, waited = time.perf_counter(), self.transport.room_ms
        value = self.transport.stage(t)
        waited = self.transport.room_ms - waited  # (the worker's time, not the copy's)
        c = self.counters
        c["bytes_up"] += t.numel() * t.element_size()
        c["up_ms"] += (time.perf_counter() - t0) * 1e3 - waited
        c["up_wait_ms"] += waited
        return value

    def fetch(self, vid: int):
        """Value ``vid`` as a plain CPU tensor of its own (a sync)."""
        value = self.request(Fetch(vid))
        c = self.counters
        c["fetches"] += 1
        c["bytes_down"] += value.numel() * value.element_size()
        c["down_ms"] += self.transport.copy_ms
        return value

    def request(self, req):
        """Flush, then wait for the worker's answer to ``req`` (gt_core.stream.requests)."""
        with LOCK:
            check_interrupt()  # one held since gt's last op: the stream is whole here
            self.check()
            self.flush()
            self.matcher.lines.count("syncs", self.counters)
            try:
                return self.transport.request(req)
            except WorkerDied as exc:
                self.dead = str(exc)
                raise
            except Exception as exc:
                self._failed(exc)
                raise

    # -- where values were recorded, for the worker's errors -----------------------------
    def site(self, vid: int, where: tuple[str, int] | None) -> None:
        """Remember the user's line that recorded value ``vid`` (the newest _SITES kept)."""
        if where is not None:
            self.sites[vid] = where
            if len(self.sites) > _SITES:
                del self.sites[next(iter(self.sites))]

    def _failed(self, exc: BaseException) -> None:
        _log_failure(exc, self.sites, self.log)

    def lost(self) -> str | None:
        """Why this session's worker can no longer run work (None: it can)."""
        if self.dead is not None:
            return self.transport.cause or self.dead
        if not self.transport.alive():
            self.dead = str(self.transport.death("between two requests"))
            return self.transport.cause or self.dead
        return None

    def check(self) -> None:
        """Raise if this session's worker can no longer run work."""
        if self.closed:
            raise WorkerLost(
                "this tensor lived on a gt worker that died, was stopped or restarted; its value "
                "is gone. Re-run the code that creates it."
            )
        if self.dead is not None:
            self.buf.clear()  # work for a dead worker: nothing will ever run it
            self.freed.clear()
            self.matcher.forget()
            self.route = self._routed()
            raise WorkerDied(self.dead)

    def close(self) -> None:
        if not self.closed:
            try:
                self.flush()
            except Exception:
                pass
            self.closed = True
            self.transport.stop()


def _transport_class(options: Options):
    """The transport the options ask for: a process here (or a group of them), this
    process, or a remote one."""
    worker = options.worker
    if options.workers > 1 and worker == "process":
        from gt_core.client.transports.group import GroupTransport

        return GroupTransport
    if worker == "inprocess":
        from gt_core.client.transports.inprocess import InProcessTransport

        return InProcessTransport
    if worker.startswith("tcp://"):
        from gt_core.client.transports.tcp import RemoteTransport

        return RemoteTransport
    from gt_core.client.transports.transport import ProcessTransport

    return ProcessTransport


def _log_failure(exc: BaseException, sites: dict, log: ev.EventLog) -> None:
    """A worker error reaches the user: say the line that recorded the failing op (from
    ``sites``, value id -> (file, line)), and log it."""
    outs = getattr(exc, "gt_outs", None) or ()
    line = _line(next((sites[v] for v in outs if v in sites), None))
    if line is not None:
        exc.add_note(f"(recorded at {line})")
    message, notes = str(exc).splitlines()[0] if str(exc) else "", getattr(exc, "__notes__", ())
    log.emit(ev.ERROR, error=type(exc).__name__, message=message, notes=list(notes), where=line)


def _line(where: tuple[str, int] | None) -> str | None:
    """'file:line: source text' for a recorded site (None: not known)."""
    if where is None:
        return None
    file, lineno = where
    text = linecache.getline(file, lineno).strip()
    return f"{file}:{lineno}" + (f": {text}" if text else "")
