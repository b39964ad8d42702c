"""How long a block's run took: the wall clock on the CPU, CUDA events read later on a GPU.

On a GPU a run only launches work. Waiting for it to end (a device sync) after every run
would make the client, the worker's Python and the GPU take turns instead of overlapping.
There a run is timed by two events recorded around it on the current stream and read once
the later one has happened: nobody waits for them, and whoever reads the time (the judge,
the dashboard's per-iteration timing) gets it a few runs later, in the order the runs ran.
"""

from __future__ import annotations

import time
from collections import deque

import torch

__all__ = ["Pending", "Timings", "events", "for_device", "wall"]


class Pending:
    """A run's time still being measured on the device (two CUDA events around it)."""

    __slots__ = ("start", "end")

    def __init__(self, start, end):
        self.start, self.end = start, end

    def done(self) -> bool:
        """Whether the run has ended on the device (asks, never waits)."""
        return self.end.query()

    def ms(self) -> float:
        """Its milliseconds (waits for the run where it has not ended)."""
        self.end.synchronize()
        return self.start.elapsed_time(self.end)


def wall(kind: str, fn, *args):
    """(result, milliseconds) of a run of ``kind`` ("eager" or "compiled") on the CPU."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t0) * 1e3


def events(kind: str, fn, *args):
    """(result, Pending) of a run of ``kind`` on the current CUDA stream: launched, not awaited."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn(*args)
    end.record()
    return out, Pending(start, end)


def for_device(device: torch.device):
    """The timer of a worker on ``device`` (Runner.timer's default)."""
    return events if device.type == "cuda" else wall


class Timings:
    """Times of runs not read yet, oldest first, each with what takes it once read."""

    def __init__(self):
        self.pending: deque = deque()

    def then(self, ms, take) -> None:
        """``take(ms)`` now where ``ms`` is a number, else once the run it times has ended
        (``settle``): times are taken in the order the runs were launched."""
        if type(ms) is Pending or self.pending:
            self.pending.append((ms, take))
        else:
            take(ms)

    def settle(self, wait: bool = False) -> None:
        """Take every time whose run has ended (all of them, waiting, with ``wait``)."""
        q = self.pending
        while q and (wait or type(q[0][0]) is not Pending or q[0][0].done()):
            ms, take = q.popleft()
            take(ms.ms() if type(ms) is Pending else ms)
