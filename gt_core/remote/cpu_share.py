"""The worker's share of the CPU: its intra-op threads, by who else is busy."""

from __future__ import annotations

import statistics

__all__ = ["CpuShare"]


class CpuShare:
    """The worker's intra-op threads on a CPU: every core while the client waits for an answer,
    one fewer while the client records the next steps, one fewer again while a block compiles.

    Two busy processes on too few cores stall each other: OpenMP's barriers spin for threads
    the client's recording has preempted (benchmarks/overhead.py and stall.py measure it; the
    README has the figures). Whether a compiled block gains from the extra core while the
    client waits depends on the block (small kernels lose to waking a second thread), so each
    block tries both counts a few times and keeps the one with the lower median (see choose
    and learn).
    """

    TRIALS = 5  # runs per thread count before a block's choice is made

    def __init__(self, device, threads: int | None = None):
        import torch

        self.torch = torch
        self.all = torch.get_num_threads()
        self.active = device.type == "cpu" and self.all > 1
        self.now = self.all
        self.waits = False
        self.compiling = False
        # () -> whether the client waits now, reading messages that arrived since the block's
        # own (a sync sent right after a replayed call's RUN: see choose). None: not known.
        self.recheck = None
        self.trials: dict[str, dict[int, list[float]]] = {}  # block -> thread count -> ms
        self.chosen: dict[str, int] = {}
        if threads:  # a fixed count instead (options.worker_threads; benchmarks)
            torch.set_num_threads(threads)
            self.active = False

    def set(self, client_waits: bool, compiling: bool = False) -> None:
        if not self.active:
            return
        self.waits, self.compiling = client_waits, compiling
        self._use(max(1, self.all - (not client_waits) - compiling))

    def _use(self, n: int) -> None:
        if n != self.now:
            self.torch.set_num_threads(n)
            self.now = n

    def choose(self, block: str) -> int | None:
        """The thread count for a compiled run of ``block`` now (None: the current one)."""
        if self.active and not self.waits and self.recheck is not None and self.recheck():
            self.set(True, self.compiling)  # the client's sync came in after the block's RUN
        if not self.active or not self.waits or self.now < 2:
            return None  # nothing to choose: the client records beside it, or one core
        n = self.chosen.get(block)
        if n is None:
            tried = self.trials.setdefault(block, {self.now: [], self.now - 1: []})
            n = min(tried, key=lambda k: len(tried[k]))  # the count tried least so far
        n = min(n, self.now)
        self._use(n)
        return n

    def learn(self, block: str, n: int | None, ms: float) -> bool:
        """A compiled run of ``block`` with ``n`` threads took ``ms``; False while trying."""
        if n is None or block in self.chosen:
            return True
        tried = self.trials[block]
        tried.setdefault(n, []).append(ms)
        if all(len(v) >= self.TRIALS for v in tried.values()):
            self.chosen[block] = min(tried, key=lambda k: statistics.median(tried[k]))
        return False
