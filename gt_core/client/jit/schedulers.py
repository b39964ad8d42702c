"""An LR scheduler the step steps: its Python runs outside the step's block.

A replay steps each LR scheduler the recorded call stepped, after its RUN (see
``recording.mutated``), so a scheduler's work belongs after the block. With a float
learning rate it has none; with a tensor one it does (a scheduler multiplies and fills the
tensor, and keeps clones of it as ``_last_lr``), and recorded into the block those ops would
freeze the numbers of one call. So while a call records, the first step of a scheduler the
step reaches ends the block (``End.close``): the scheduler runs as any code outside a jitted
function, and so does the rest of the call. Work after it (an op, an upload, a read of a
tensor's value) is not in the block and a replay would not do it: the recorded call is then
unreplayable (``End.after``). Values the call frees on its way out are not work: the block
leaves them as outputs, and a replay lets them go.
"""

from __future__ import annotations

import contextlib

import torch

from gt_core.client.session import LOCK
from gt_core.stream.instructions import FREE, MARK, Mark

__all__ = ["End", "outside"]


class End:
    """Where a recorded call's block ends: at the call's exit, or at its first step of an
    LR scheduler (``close``, once); what the call did after (``after``, ``late_frees``)."""

    def __init__(self, session, name: str):
        self.session, self.name = session, name
        self.closed = False
        self.counted: dict | None = None  # the session's counters as the block ended
        self.tail: list | None = None  # the instructions outside the schedulers' steps, after
        self.tail_puts: list = []
        self.tail_reads = 0  # values read there
        self.depth = 0  # schedulers' steps running (a chained one steps others)
        # () -> {site: expressions} of the numbers sent anew each call (settings.by_origin),
        # asked as the block ends: the exit mark names their sites for the worker to lift
        self.by_origin = None
        self.origin: dict = {}
        self._since: dict | None = None

    def close(self) -> None:
        """End the block: the exit mark, the recording's taps off (once; later, the taps
        on what came after)."""
        s = self.session
        with LOCK:
            if not self.closed:
                self.closed = True
                self.origin = self.by_origin() if self.by_origin is not None else {}
                force = tuple(sorted(self.origin, key=repr))
                s.emit(Mark(MARK, self.name, "exit", force))  # (the call's frees come first)
                s.shadow_log = None
                self.counted = dict(s.counters)
            elif self._since is not None:
                if s.freed:  # (the call's locals, freed on its way out: into the tail)
                    s.drain_frees()
                self.tail_reads += _reads(s.counters, self._since)
                self._since = None
            s.tee, s.tee_puts = None, None
            s.flush()

    def stepping(self, step, args, kwargs):
        """A scheduler's step, run outside the block."""
        if self.depth:
            return step(*args, **kwargs)
        self.close()
        self.depth += 1
        was = torch.compiler._is_compiling_flag
        torch.compiler._is_compiling_flag = False  # (as a replay steps it: eagerly)
        try:
            return step(*args, **kwargs)
        finally:
            torch.compiler._is_compiling_flag = was
            self.depth -= 1
            self._resume()

    def _resume(self) -> None:
        s = self.session
        with LOCK:
            s.flush()
            self._since = dict(s.counters)
            if self.tail is None:
                self.tail = []
            s.tee, s.tee_puts = self.tail, self.tail_puts

    def after(self) -> str | None:
        """The work the call did after a scheduler's step, in words (None: none); once the
        block is closed."""
        ops = sum(ins.code != FREE for ins in self.tail or ()) + len(self.tail_puts)
        if not ops and not self.tail_reads:
            return None
        return f"{ops} op(s) and {self.tail_reads} read(s) of a tensor's value"

    def late_frees(self) -> set:
        """The value ids freed after the block ended (the call's locals, on its way out)."""
        return {ins.vid for ins in self.tail or () if ins.code == FREE}


def _reads(now: dict, since: dict) -> int:
    return sum(now[k] - since.get(k, 0) for k in ("syncs", "shadow_reads"))


@contextlib.contextmanager
def outside(schedulers, end: End):
    """While a call records: each of ``schedulers`` (those the step reaches) ends the block
    when stepped, and steps as it would outside a jitted function."""
    patched = []
    for sched in schedulers:
        if "step" in vars(sched):
            continue  # (already wrapped: a scheduler reached twice, or a user's own)
        sched.step = _stepped(type(sched).step.__get__(sched), end)
        patched.append(sched)
    try:
        yield
    finally:
        for sched in patched:
            del sched.step


def _stepped(step, end: End):
    def run(*args, **kwargs):
        return end.stepping(step, args, kwargs)

    return run
