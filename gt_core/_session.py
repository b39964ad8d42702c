"""The client's connection to one worker: ids, the pending batch, syncs, counters.

A session lives as long as its worker. Restarting the worker starts a new session, so a
proxy can tell whether the worker that holds its value still exists.
"""

from __future__ import annotations

import itertools
import os

from . import events as ev
from ._instructions import DEFOP, qualified_name
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
        cls = InProcessTransport if options.worker == "inprocess" else ProcessTransport
        self.transport = cls(options, log.extend)
        self.buf: list = []
        self.next_id = 1
        self.op_index: dict = {}
        self.closed = False
        self.dead: str | None = None  # why the worker died, once a send or a sync found out
        self.flush_at = FLUSH_AT
        self.counters = {"ops": 0, "frees": 0, "syncs": 0, "uploads": 0}

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
            self.buf.append((DEFOP, idx, qualified_name(func)))
        return idx

    # -- the stream ----------------------------------------------------------------------
    def emit(self, ins) -> None:
        buf = self.buf
        buf.append(ins)
        if len(buf) >= self.flush_at:
            self.flush()

    def flush(self) -> None:
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
