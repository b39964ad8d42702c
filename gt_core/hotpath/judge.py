"""The regression check: a compiled block slower than its eager runs goes back to eager.

Timings compare only within one CPU condition (what the worker shared its cores with during
a run: the client's recording, or its waiting; a compile beside it), and a check waits for a
compile beside the runs to end. Where no clean eager run was timed in the compiled runs'
condition, a few eager occurrences are run as probes first.
"""

from __future__ import annotations

import contextlib
from collections import deque

from gt_core.hotpath.blocks import TIMED_RUNS, Block
from gt_core.hotpath.part import Part
from gt_core.observe import events as ev
from gt_core.observe import metrics
from gt_core.observe.report import Status

__all__ = ["Judge"]

# A regression check compares against metrics.MIN_BASELINE clean eager runs, so that the
# median is not moved by one slow run (the first run of a block's eager graph after a compile
# often is).
_MAX_PROBES = 4 * metrics.MIN_BASELINE  # eager runs timed for it at most, after the compile
_SLOWER = 1.05  # a compiled median over this many times the eager one is a regression
_PATIENCE = 50  # compiled runs a check waits for a compile beside them to end


class Judge(Part):
    """Keeps each block's timings by CPU condition and decides whether compiling paid off."""

    def __init__(self, outbox, compiler, options):
        self.outbox = outbox
        self.compiler = compiler  # (its count of compiles under way is part of the condition)
        self.options = options
        self.share = None  # the worker process's intra-op threads (remote.cpu_share.CpuShare)

    def use_share(self, share) -> None:
        """The worker process's intra-op threads (remote.cpu_share.CpuShare) from now."""
        self.share = share

    @contextlib.contextmanager
    def threads(self, block: Block):
        """Around a compiled run of ``block``: the intra-op threads the CPU share chooses for it
        (the count it yields goes to compiled_ran), and eager's count again after it."""
        share = self.share
        if share is None:
            yield None
            return
        try:
            yield share.choose(block.sig)
        finally:
            share.release()

    def compiled_ran(self, block: Block, ms: float, threads) -> None:
        """A compiled run took ``ms`` with ``threads`` intra-op threads (the share's choice)."""
        block.compiled_ms.append(ms)
        share = self.share
        if share is None or share.learn(block.sig, threads, ms):
            # (a run trying the other thread count is no sample of the compiled block)
            self._sample(block, "compiled", ms)
        self.outbox.emit(ev.ITERATION, signature=block.sig, kind="compiled", ms=ms)

    def eager_ran(self, block: Block, ms: float, first=False, beside=False) -> None:
        """An eager run took ``ms``: a baseline sample, unless a compile slowed it (``beside``:
        the block compiled as it began; or it still does) or it was its eager graph's
        ``first`` run (many times slower than the runs after it: FX's generated code and the
        kernels' first calls), which a probe does not count for."""
        if beside or block.status == Status.COMPILING:
            # Slowed by the compile beside it: shown as such, never an eager baseline (a run
            # that began beside the compile and ended after it too: most of it was beside).
            self.outbox.emit(ev.ITERATION, signature=block.sig, kind="compiling", ms=ms)
            return
        block.eager_ms.append(ms)
        if not first:
            self._sample(block, "eager", ms)
        self.outbox.emit(ev.ITERATION, signature=block.sig, kind="eager", ms=ms)
        if block.probe:
            block.probed_once(first)
            if not block.probe:
                self.check(block)

    def check(self, block: Block) -> None:
        """Judge the block once enough compiled runs are timed; ask for probes if needed."""
        if block.judged:
            return
        if (
            self.share is not None
            and self.compiler.compiling
            and len(block.compiled_ms) < _PATIENCE
        ):
            # Runs beside a compile (another block's, or the compile process warming up) are
            # slowed by it unevenly, eager and compiled alike: a verdict there was a coin
            # toss. Judge once it ends, unless compiles keep the CPU busy for long.
            return
        cond = self._condition()
        compiled = block.samples.get(("compiled", cond), ())
        if len(compiled) < self.options.regression_samples:
            return
        eager = block.samples.get(("eager", cond), ())
        if len(eager) < metrics.MIN_BASELINE:
            if block.probed >= _MAX_PROBES:  # the condition keeps changing: all runs
                self._decide(block, block.eager_ms, block.compiled_ms, "all of them")
                return
            # No clean eager run timed as the compiled ones ran (compiled in the background
            # before one was: runs beside a compile are slowed by it; or the client waited
            # for those and records beside these, which leaves the worker a core fewer):
            # time a few eager occurrences now, then judge.
            block.want_probes(metrics.MIN_BASELINE - len(eager))
            return
        self._decide(block, eager, compiled, _in_words(cond))

    def _decide(self, block: Block, eager_ms, compiled_ms, runs: str = "") -> None:
        """Revert to eager if the compiled median is slower than the eager one.

        ``runs``: which runs were compared, in words (the reason says it). Either verdict's
        event carries both medians: the report's eager baseline of a judged block is the one
        judged against (runs in the compiled runs' CPU condition; gt_core.observe.metrics),
        and a reverted block's compiled ms is the one judged, so the reason and the tables
        say the same numbers.
        """
        block.judged_now()
        n = len(compiled_ms)
        eager = metrics.median(list(eager_ms))
        comp = metrics.median(list(compiled_ms))
        if comp > eager * _SLOWER:
            block.move(Status.REVERTED)
            self.outbox.emit(
                ev.REVERT,
                signature=block.sig,
                eager_ms=eager,
                compiled_ms=comp,
                reason=f"compiled median {comp:.3g} ms is slower than eager {eager:.3g} ms over {n} runs"
                + (f" ({runs})" if runs else ""),
                runs=block.runs_to_settle(),
            )
        else:
            self.outbox.emit(
                ev.KEPT,
                signature=block.sig,
                eager_ms=eager,
                compiled_ms=comp,
                runs=block.runs_to_settle(),
            )

    def _sample(self, block: Block, kind: str, ms: float) -> None:
        """A timing of ``kind`` in the current CPU condition."""
        key = (kind, self._condition())
        series = block.samples.get(key)
        if series is None:
            series = block.samples[key] = self._series()
        series.append(ms)

    def _series(self) -> deque:
        """A bounded series of timings, long enough for a regression check."""
        return deque(maxlen=max(TIMED_RUNS, self.options.regression_samples))

    def _condition(self):
        """What the worker's CPU was shared with during a run: timings compare within one."""
        share = self.share
        return None if share is None else (share.waits, self.compiler.compiling > 0)


def _in_words(condition) -> str:
    """A CPU condition (Judge._condition) as the revert reason names it."""
    if condition is None:
        return ""
    waits, compiling = condition
    words = "the client waiting for each" if waits else "each beside the client's recording"
    return words + (", another block compiling" if compiling else "")
