"""An LR scheduler the step steps: its Python runs outside the step's block.

A replay steps each LR scheduler the recorded call stepped, after its RUN (see
``recording.mutated``), so a scheduler's work belongs after the block.

With float settings (the common case: transformers' schedules, StepLR, OneCycleLR) a
scheduler's step is Python alone: the block goes on past it, and the rest of the call
(``model.zero_grad()``, ``return loss.detach()``, as transformers' Trainer orders its step)
is in the block, as if the scheduler had stepped last. That holds while nothing after it
reads what it changed: an optimizer's step, or an op passed a number computed from a
setting, after it makes the recorded call unreplayable (a replay computes the settings'
numbers as the call begins). A pure step that turns out to do work (an op, an upload, a
read of a tensor's value: ``ReduceLROnPlateau.step(loss)``) does too.

With a tensor setting a scheduler's step does work (it multiplies and fills the tensor, and
keeps clones of it as ``_last_lr``), and recorded into the block those ops would freeze the
numbers of one call. So while a call records, the first step of such a scheduler ends the
block (``End.close``): the scheduler runs as any code outside a jitted function, and so does
the rest of the call. Work after it (an op, an upload, a read of a tensor's value) is not in
the block and a replay would not do it: the recorded call is then unreplayable
(``End.after``). Values the call frees on its way out are not work: the block leaves them
as outputs, and a replay lets them go.
"""

from __future__ import annotations

import contextlib

import torch

from gt_core.client.session import LOCK
from gt_core.stream.instructions import FREE, MARK, OP, Mark

__all__ = ["End", "outside"]


class End:
    """Where a recorded call's block ends: at the call's exit, or at its first step of an
    LR scheduler (``close``, once); what the call did after (``after``, ``late_frees``)."""

    def __init__(self, session, name: str, by_origin=None):
        self.session, self.name = session, name
        self.closed = False
        self.counted: dict | None = None  # the session's counters as the block ended
        self.tail: list | None = None  # the instructions outside the schedulers' steps, after
        self.tail_puts: list = []
        self.tail_reads = 0  # values read there
        self.depth = 0  # schedulers' steps running (a chained one steps others)
        # () -> {site: expressions} of the numbers sent anew each call (settings.by_origin),
        # asked as the block ends: the exit mark names their sites for the worker to lift
        self.by_origin = by_origin
        self.origin: dict = {}
        self._since: dict | None = None
        # a pure scheduler's first step: the recorded instructions before it (None: none
        # stepped), and the work a pure step did after all (in words)
        self.pure_at: int | None = None
        self.impure: str | None = None

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
                self.counted = dict(s.counters)
            elif self._since is not None:
                if s.freed:  # (the call's locals, freed on its way out: into the tail)
                    s.drain_frees()
                self.tail_reads += _reads(s.counters, self._since)
                self._since = None
            s.stop_recording()
            s.flush()

    def stepping(self, sched, step, args, kwargs):
        """A scheduler's step: inside the block where it is Python alone (float settings),
        else run outside it."""
        if self.depth:
            return step(*args, **kwargs)
        if not self.closed and _pure(sched):
            return self._pure_step(step, args, kwargs)
        self.close()
        try:
            return self._eagerly(step, args, kwargs)
        finally:
            self._resume()

    def _eagerly(self, step, args, kwargs):
        """``step`` run as a replay steps it: eagerly, not as torch.compile traces."""
        self.depth += 1
        flag = torch.compiler._is_compiling_flag
        torch.compiler._is_compiling_flag = False
        try:
            return step(*args, **kwargs)
        finally:
            torch.compiler._is_compiling_flag = flag
            self.depth -= 1

    def _pure_step(self, step, args, kwargs):
        s = self.session
        with LOCK:
            s.flush()
            was = (_work(s.tee), len(s.tee_puts), dict(s.counters))
            if self.pure_at is None:
                self.pure_at = len(s.tee)
        try:
            return self._eagerly(step, args, kwargs)
        finally:
            with LOCK:
                s.flush()
                ops = _work(s.tee) - was[0] + len(s.tee_puts) - was[1]
                reads = _reads(s.counters, was[2])
                if (ops or reads) and self.impure is None:
                    self.impure = f"its own step did {ops} op(s) and {reads} read(s) of a value"

    def read_after(self, spans: list, knob_floats: dict, instrs: list) -> str | None:
        """What read the settings after a pure scheduler's step, in words (None: nothing):
        an optimizer's step, or an op passed a number computed from a setting."""
        if self.pure_at is None:
            return None
        if any(start >= self.pure_at for start, _ in spans):
            return "an optimizer's step, reading the settings it changed"
        j = sum(ins.code in (OP, FREE) for ins in instrs[: self.pure_at])
        if any(site[0] >= j for site in knob_floats):
            return "an op passed a number computed from the settings it changed"
        return None

    def _resume(self) -> None:
        s = self.session
        with LOCK:
            s.flush()
            self._since = dict(s.counters)
            if self.tail is None:
                self.tail = []
            s.record_into(self.tail, self.tail_puts)

    def after(self) -> str | None:
        """The work the call did after a scheduler's step outside the block, or that a pure
        step did, in words (None: none); once the block is closed."""
        if self.impure is not None:
            return self.impure
        ops = sum(ins.code != FREE for ins in self.tail or ()) + len(self.tail_puts)
        if not ops and not self.tail_reads:
            return None
        return f"{ops} op(s) and {self.tail_reads} read(s) of a tensor's value"

    def late_frees(self) -> set:
        """The value ids freed after the block ended (the call's locals, on its way out)."""
        return {ins.vid for ins in self.tail or () if ins.code == FREE}


def _pure(sched) -> bool:
    """Whether ``sched``'s optimizer holds no tensor among its settings (its step is then
    Python alone on numbers)."""
    opt = getattr(sched, "optimizer", None)
    groups = getattr(opt, "param_groups", None)
    if groups is None:
        return False
    for g in groups:
        for k, v in g.items():
            if k != "params" and (isinstance(v, torch.Tensor) or _holds_tensor(v)):
                return False
    return True


def _holds_tensor(v) -> bool:
    return isinstance(v, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in v)


def _work(instrs) -> int:
    return sum(ins.code != FREE for ins in instrs)


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
        sched.step = _stepped(sched, type(sched).step.__get__(sched), end)
        patched.append(sched)
    try:
        yield
    finally:
        for sched in patched:
            del sched.step


def _stepped(sched, step, end: End):
    def run(*args, **kwargs):
        return end.stepping(sched, step, args, kwargs)

    return run
