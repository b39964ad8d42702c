"""What a worker process has published on its events connection: batches sent one at a time,
and counted, so that a drain's answer says how many the client must have read (see the
client's ``drain``). A torchrun group's rank 0 publishes the other ranks' batches too (see
gt_core.worker_process.torchrun), and waits for theirs before it answers a drain."""

from __future__ import annotations

import threading

__all__ = ["send", "sent", "drain_others", "wait_for_others"]

_sent = [0]  # event batches this process has published
_lock = threading.Lock()
_others = [None]  # see drain_others


def send(event_conn, events: list) -> None:
    """Publish one batch of events (this worker's, or another rank's that it relays)."""
    with _lock:
        event_conn.send(events)
        _sent[0] += 1


def sent() -> int:
    """How many batches this process has published so far."""
    return _sent[0]


def drain_others(wait) -> None:
    """A torchrun group's rank 0: ``wait()`` returns once the other ranks' events up to this
    point of the stream are published here; each drain calls it first (wait_for_others)."""
    _others[0] = wait


def wait_for_others() -> None:
    if _others[0] is not None:
        _others[0]()
