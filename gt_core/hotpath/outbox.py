"""The engine's events on their way to the client: held briefly, sent in batches.

Iteration events wait up to ``_EVENTS_EVERY_S`` to travel together (one message per step
would cost the client a wake-up of its event thread per step); any other event, and every
sync, sends them all at once.
"""

from __future__ import annotations

import threading
import time

from gt_core.hotpath.part import Part
from gt_core.observe import events as ev

__all__ = ["Outbox", "reason"]

# GT_DEBUG_COMPILE=1: one line per detection, compile, fallback, revert (2: every event
# but iterations: also compile starts, signals and mismatches).
_DEBUG_LINES = frozenset(
    (
        ev.DETECTED,
        ev.COMPILE_FINISHED,
        ev.COMPILE_FAILED,
        ev.COMPILE_CANCELLED,
        ev.CACHE_EVICTED,
        ev.RECOMPILE,
        ev.FALLBACK,
        ev.REVERT,
        ev.CHECK_FAILED,
        ev.RETIRED,
    )
)
_EVENTS_EVERY_S = 0.05
_FORMS = ev.FORMS | {ev.PLAN}  # events that say what a block is, or only feed the client


class Outbox(Part):
    """Events emitted by the engine (and its compile threads), published in batches."""

    def __init__(self, publish, options):
        self.publish = publish
        self.options = options
        self.events: list[dict] = []
        self._lock = threading.Lock()  # the compile threads emit too
        self._published = 0.0  # perf_counter of the last publish
        self._urgent = False  # an event other than an iteration's timing is pending
        self.closed = False
        # Fields every iteration event carries, as they are when it is emitted (a worker
        # group's rank: its collectives so far, see gt_core.worker_process.comms); None: none.
        self.stamp = None
        # (signature) -> None, before any other event of a block: it says what it is first,
        # if the client forgot (Registry.announce); None: nothing to say.
        self.before = None

    def announce_with(self, before) -> None:
        """``before(sig)`` says what a block is ahead of its first event since a reset."""
        self.before = before

    def stamp_with(self, stamp) -> None:
        """``stamp()``: the fields every iteration event carries from now."""
        self.stamp = stamp

    def emit(self, type: str, **fields) -> None:
        sig = fields.get("signature")
        if sig is not None and self.before is not None and type not in _FORMS:
            self.before(sig)
        if type == ev.ITERATION and self.stamp is not None:
            fields.update(self.stamp())
        e = ev.event(type, **fields)
        with self._lock:
            if self.closed:
                return
            self.events.append(e)
            if type != ev.ITERATION:
                self._urgent = True
        debug = self.options.debug
        if debug and (type in _DEBUG_LINES or (debug >= 2 and type not in (ev.ITERATION, ev.PLAN))):
            detail = fields.get("reason") or fields.get("seconds") or fields.get("n_ops") or ""
            print(f"gt: {type} {fields.get('signature', '')} {detail}", flush=True)

    def flush(self) -> None:
        with self._lock:
            events, self.events, self._urgent = self.events, [], False
        if events:
            self._published = time.perf_counter()
            self.publish(events)

    def close(self) -> None:
        """Publish nothing more. A compile thread that ends after its engine closed (a block
        compiling when the worker stopped) belongs to a session that is over: its outcome,
        published, showed up in the next session's report as a hot path of its own."""
        with self._lock:
            self.closed = True
            self.events = []

    def flush_soon(self) -> None:
        """Publish now unless only iteration timings are pending and some went out just now."""
        if self.events and (
            self._urgent or time.perf_counter() - self._published >= _EVENTS_EVERY_S
        ):
            self.flush()


def reason(exc: BaseException) -> str:
    """An exception as an event's reason: its type and message, at most 2000 characters."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 2000 else text[:2000] + " …"
