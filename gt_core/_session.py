"""The client's connection to one worker: ids, the pending batch, syncs, counters.

A session lives as long as its worker. Restarting the worker starts a new session, so a
proxy can tell whether the worker that holds its value still exists.

Every instruction goes through :meth:`Session.emit`. Once the worker has sent plans of its
hot blocks, emit hands instructions to the :class:`~gt_core._plan.Replay`, which turns each
complete occurrence into one RUN and sends it at once (the worker runs step i while the
client records step i+1). Proxies that die only queue their id (``freed``): a free never
re-enters the matcher from a destructor; it joins the stream before the next instruction.
"""

from __future__ import annotations

import itertools
import os
from collections import deque

from . import events as ev
from ._instructions import DEFOP, FREE, defining_module, qualified_name
from ._plan import Replay
from .config import Options
from .errors import WorkerDied, WorkerLost

__all__ = ["Session"]

_generations = itertools.count(1)
FLUSH_AT = int(os.environ.get("GT_FLUSH_AT", "512"))


class Session:
    """Ids, the pending batch and the transport of one worker generation."""

    def __init__(self, options: Options, log: ev.EventLog):
        from ._transport import InProcessTransport, ProcessTransport

        self.gen = next(_generations)
        self.options = options
        self.log = log
        self.buf: list = []
        self.freed: deque = deque()  # ids of proxies that died since the last instruction
        self.replay = Replay(self._out, self._send)
        cls = InProcessTransport if options.worker == "inprocess" else ProcessTransport
        self.transport = cls(options, self._on_events)
        self.next_id = 1
        self.op_index: dict = {}
        self.closed = False
        self.dead: str | None = None  # why the worker died, once a send or a sync found out
        self.flush_at = FLUSH_AT
        self.counters = {"ops": 0, "frees": 0, "syncs": 0, "uploads": 0}

    def _on_events(self, events) -> None:
        """Events from the worker: plans go to the matcher, everything else to the log."""
        if any(e["type"] == ev.PLAN for e in events):
            for e in events:
                if e["type"] == ev.PLAN and self.options.client_match:
                    self.replay.offer(e["signature"], e["plan"])
            events = [e for e in events if e["type"] != ev.PLAN]
        if events:
            self.log.extend(events)

    def set_options(self, options: Options) -> None:
        """New options for this session (the caller has sent them to the worker)."""
        self.options = options
        if not options.client_match:
            self.flush()
            self.replay.forget()

    # -- ids and ops ---------------------------------------------------------------------
    def new_ids(self, n: int) -> range:
        first = self.next_id
        self.next_id += n
        return range(first, first + n)

    def op(self, func) -> int:
        """The small integer naming ``func`` on this worker (defined on first use)."""
        idx = self.op_index.get(func)
        if idx is None:
            idx = self.op_index[func] = len(self.op_index)
            self.buf.append((DEFOP, idx, qualified_name(func), defining_module(func)))
        return idx

    # -- the stream ----------------------------------------------------------------------
    def emit(self, ins) -> None:
        """Add one instruction to the stream."""
        if self.freed:
            self._frees()
        if self.replay.live:
            self.replay.feed(ins)
        else:
            self._out(ins)

    def _out(self, ins) -> None:
        """Into the batch that goes out next (what the matcher lets through, too)."""
        buf = self.buf
        buf.append(ins)
        if len(buf) >= self.flush_at:
            self.flush()

    def _frees(self) -> None:
        freed, replay = self.freed, self.replay
        while freed:
            vid = freed.popleft()
            if replay.live:
                replay.free(vid)
            else:
                self.buf.append((FREE, vid))

    def flush(self) -> None:
        """Send what is pending (an occurrence being matched goes out as instructions)."""
        if self.freed:
            self._frees()
        if self.replay.kept:
            self.replay.release()
        self._send()

    def _send(self) -> None:
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

    def request(self, kind: str, payload=None):
        """Flush, then wait for the worker's answer (one round trip)."""
        self.check()
        self.flush()
        self.counters["syncs"] += 1
        try:
            return self.transport.request(kind, payload)
        except WorkerDied as exc:
            self.dead = str(exc)
            raise

    def check(self) -> None:
        """Raise if this session's worker can no longer run work."""
        if self.dead is not None:
            self.buf.clear()  # work for a dead worker: nothing will ever run it
            self.freed.clear()
            self.replay.forget()
            raise WorkerDied(self.dead)
        if self.closed:
            raise WorkerLost(
                "this tensor lived on a gt worker that was stopped or restarted; its value is gone. "
                "Re-run the code that creates it."
            )

    def publish_stats(self) -> None:
        self.log.emit(ev.STATS, **self.counters)

    def close(self) -> None:
        if not self.closed:
            try:
                self.flush()
            except Exception:
                pass
            self.closed = True
            self.transport.stop()
