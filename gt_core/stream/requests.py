"""Requests to the worker: one NamedTuple per kind, beside the instructions they follow.

A request flushes the stream and waits for its answer (a sync): the worker runs everything
sent before it, then answers by the request's type (gt_core.worker_process.serve). ``kind`` names the
request in the worker's sync point and in the client's messages ("waiting for fetch");
requests of kind "engine" ask the hot-path engine (gt_core.hotpath.engine.Engine.control)
and may wait long on purpose (compiles).
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "Fetch",
    "Call",
    "Stats",
    "Ping",
    "EventsSent",
    "RngState",
    "DefaultDtype",
    "SetOptions",
    "WaitCompiles",
    "JitPlan",
    "Forget",
    "TENSOR_ANSWERS",
]


class Fetch(NamedTuple):
    """Value ``vid`` as a tensor (its answer travels staged)."""

    vid: int
    kind = "fetch"


class Call(NamedTuple):
    """Run op ``idx`` now, its result described back (an op that needs real data)."""

    idx: int
    args: tuple
    kwargs: dict
    base: Any
    kind = "call"


class Stats(NamedTuple):
    """The executor's counters."""

    kind = "stats"


class Ping(NamedTuple):
    """The worker's pid and device (its start is done)."""

    kind = "ping"


class EventsSent(NamedTuple):
    """The count of event batches the worker has published, every event up to here sent."""

    kind = "events_sent"


class RngState(NamedTuple):
    """The worker's CPU generator state (its answer travels staged)."""

    kind = "rng"


class DefaultDtype(NamedTuple):
    """The worker's default dtype (torch.set_default_dtype) becomes ``dtype``."""

    dtype: Any
    kind = "dtype"


class SetOptions(NamedTuple):
    """The engine takes these options (gt_core.options.Options)."""

    options: Any
    kind = "engine"


class WaitCompiles(NamedTuple):
    """Wait up to ``timeout`` s for each compile under way, then send the events."""

    timeout: float | None
    kind = "engine"


class JitPlan(NamedTuple):
    """The signature and plan of the block jit call ``name`` made, if its last two calls made
    the same one; else None."""

    name: str
    kind = "engine"


class Forget(NamedTuple):
    """The client forgot the events so far (reset): each known block says again what it is
    at its next run (gt_core.observe.events.KNOWN)."""

    kind = "engine"


TENSOR_ANSWERS = (Fetch, RngState)  # requests whose answers are tensors (staged)
