"""The worker's share of the CPU: its intra-op threads, by who else is busy."""

from __future__ import annotations

import contextlib
import os
import statistics

__all__ = ["CpuShare", "worker_environment"]


SPIN = "2000"  # GOMP_SPINCOUNT of a worker process: a few microseconds of spinning


@contextlib.contextmanager
def worker_environment(**forced: str):
    """Around starting a worker process: the environment it starts with (this process's, as
    it was, after). Its OpenMP threads spin briefly after a parallel region, then sleep
    (``GOMP_SPINCOUNT``, unless the environment sets it or ``OMP_WAIT_POLICY``): long enough
    for the next kernel of a compiled block, not through the gap between two ops run one by
    one, where a spinning thread holds a core the client's recording wants. Measured on two
    cores (benchmarks/data.py and jit.py, three rounds each): libgomp's default spinning made
    plain gt's DataLoader step 3.2-4.6 ms; sleeping at once (``OMP_WAIT_POLICY=PASSIVE``)
    1.8-2.0 ms, but woke a thread for every kernel and slowed jit's batch-128 step to
    1.3-1.5 ms; 2000 spins 1.6-2.2 and 1.1-1.2 ms. ``forced``: variables set whatever they
    were.
    """
    mine = (
        {} if {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ) else {"GOMP_SPINCOUNT": SPIN}
    )
    want = {**mine, **forced}
    was = {k: os.environ.get(k) for k in want}
    os.environ.update(want)
    try:
        yield
    finally:
        for k, v in was.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


class CpuShare:
    """The worker's intra-op threads on a CPU: eager's count for every op that runs eagerly;
    for a compiled block's run, every core while the client waits for an answer, one fewer
    while the client records the next steps, one fewer again while a block compiles.

    Ops that run eagerly use the thread count eager uses, always: a matrix product or a
    reduction split over two threads rounds otherwise than over one, and a ReLU network
    amplifies such a difference into 1e-3 of its parameters within a few hundred steps
    (benchmarks/data.py, README "Data in and out"). So eager's graph, on the worker, is eager's
    numbers, whatever the client does meanwhile. A compiled block rounds as its compiler does
    whatever the count; there two busy processes on too few cores stall each other (OpenMP's
    barriers spin for threads the client's recording has preempted: benchmarks/overhead.py and
    stall.py), and whether a block gains from the extra core while the client waits depends on
    the block (small kernels lose to waking a second thread), so each block tries both counts
    a few times and keeps the one with the lower median (see choose and learn).
    """

    TRIALS = 5  # runs per thread count before a block's choice is made

    def __init__(self, device, threads: int | None = None):
        import torch

        self.torch = torch
        self.all = self.now = torch.get_num_threads()  # (the process's count as it started)
        self.cpu = device.type == "cpu"
        self.waits = False
        self.compiling = False
        # () -> whether the client waits now, reading messages that arrived since the block's
        # own (a sync sent right after a replayed call's RUN: see choose). None: not known.
        self.recheck = None
        self.trials: dict[str, dict[int, list[float]]] = {}  # block -> thread count -> ms
        self.chosen: dict[str, int] = {}
        self.fix(threads)

    def recheck_with(self, recheck) -> None:
        """``recheck()``: whether the client waits now (see choose)."""
        self.recheck = recheck

    def fix(self, threads: int | None) -> None:
        """A fixed count for every op from now on (options.worker_threads), or None: eager's
        count for eager ops, the share's choice for compiled runs. (The same again: no change.)"""
        self.active = self.cpu and self.all > 1 and not threads
        self.eager = threads or self.all  # what eager ops run with
        self._use(self.eager)

    def set(self, client_waits: bool, compiling: bool = False) -> None:
        """What the worker shares the CPU with now (read by the next compiled run's choice)."""
        self.waits, self.compiling = client_waits, compiling

    def _use(self, n: int) -> None:
        if n != self.now:
            self.torch.set_num_threads(n)
            self.now = n

    def choose(self, block: str) -> int | None:
        """Set the thread count for a compiled run of ``block`` now, and return it while the
        client waits with more than one core free (a trial's count, or the block's choice:
        learn takes the run's time); None otherwise. release() after the run."""
        if not self.active:
            return None
        if not self.waits and self.recheck is not None and self.recheck():
            self.waits = True  # the client's sync came in after the block's RUN
        free = max(1, self.all - (not self.waits) - self.compiling)
        if not self.waits or free < 2:
            self._use(free)
            return None  # nothing to choose: the client records beside it, or one core
        n = self.chosen.get(block)
        if n is None:
            tried = self.trials.setdefault(block, {free: [], free - 1: []})
            n = min(tried, key=lambda k: len(tried[k]))  # the count tried least so far
        n = min(n, free)
        self._use(n)
        return n

    def release(self) -> None:
        """A compiled run ended: eager's count again, for the ops that follow it."""
        self._use(self.eager)

    def learn(self, block: str, n: int | None, ms: float) -> bool:
        """A compiled run of ``block`` with ``n`` threads took ``ms``; False while trying."""
        if n is None or block in self.chosen:
            return True
        tried = self.trials[block]
        tried.setdefault(n, []).append(ms)
        if all(len(v) >= self.TRIALS for v in tried.values()):
            self.chosen[block] = min(tried, key=lambda k: statistics.median(tried[k]))
        return False
