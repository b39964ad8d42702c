"""Hot paths: find the block that repeats in the instruction stream and run it compiled.

The engine sits between the worker's transport and its executor, and wires these together:
each instruction either joins an occurrence of a known block (``matching``) or runs eagerly
and joins the ``history``, which the ``detector`` searches for a period that repeats. A block
found there (or marked by a signal or a jit call: ``signals``) is made and announced by the
``registry`` and compiled by the ``compiling`` scheduler; the ``runner`` runs each complete
occurrence, compiled or eagerly, and the ``judge`` reverts a compiled block slower than eager.
Events leave through the ``outbox``.

Each hot block's plan goes to the client (``gt_core.stream.plan``), which from then on sends a
whole occurrence as one RUN instruction: the engine checks its inputs against the block's
and runs it like an occurrence it matched itself, with no per-instruction work.
"""

from __future__ import annotations

import functools
from time import perf_counter

from gt_core.hotpath import nesting
from gt_core.hotpath.blocks import Blocks
from gt_core.hotpath.compiling import Compiler
from gt_core.hotpath.detector import changes, cut, periodic_since, repeating_period
from gt_core.hotpath.history import History
from gt_core.hotpath.judge import Judge
from gt_core.hotpath.matching import Matcher
from gt_core.hotpath.outbox import Outbox
from gt_core.hotpath.registry import Registry
from gt_core.hotpath.runner import Runner
from gt_core.hotpath.signals import Signals
from gt_core.stream.canonical import Mismatch
from gt_core.stream.instructions import BARRIERS, DEFOP, FREE, MARK, OP, RUN, SYNC
from gt_core.stream.lift import lift_positions
from gt_core.stream.meta import all_fit
from gt_core.stream.plan import expand
from gt_core.stream.requests import Forget, JitPlan, SetOptions, WaitCompiles

__all__ = ["Engine"]


class Engine:
    """Detects hot blocks in the stream, compiles them, and runs their occurrences."""

    def __init__(self, ex, options, publish):
        self.ex = ex
        self.outbox = outbox = Outbox(publish, options)
        self.history = History(ex.meta)
        self.blocks = Blocks()
        self.compiler = compiler = Compiler(ex.device, outbox, options)
        meta_of = self.history.meta_of
        self.registry = Registry(ex, self.blocks, meta_of, outbox, compiler, options)
        outbox.announce_with(self.registry.announce)  # (a block's first event since a reset)
        self.judge = Judge(outbox, compiler, options)
        self.runner = Runner(ex, outbox, self.judge, compiler, options)
        self.signals = Signals(self.history, self.registry, outbox, options)
        self.matcher = Matcher(
            self.blocks,
            meta_of,
            functools.partial(all_fit, ex.values),  # (the executor's one dict of values)
            ex.op_name,
            outbox,
            self._occurrence,
            self._run_and_record,
        )
        self.next_detect = 0  # the history's length when it is worth searching again
        self._after_barrier = False  # the last instruction fed was a barrier
        self._parts = (outbox, compiler, self.registry, self.judge, self.runner, self.signals)
        self._options = options

    @property
    def options(self):
        return self._options

    def use_options(self, value) -> None:
        """A new capture's options, for the engine and each of its parts."""
        self._options = value
        for part in self._parts:
            part.use_options(value)

    @property
    def timer(self):
        """(kind, fn, *args) -> (result, ms): every timed run of a block (see Runner.timer)."""
        return self.runner.timer

    @timer.setter
    def timer(self, value) -> None:
        self.runner.time_with(value)

    @property
    def cpu_share(self):
        """The worker process's intra-op threads (remote.cpu_share.CpuShare), or None."""
        return self.judge.share

    @cpu_share.setter
    def cpu_share(self, value) -> None:
        self.judge.use_share(value)

    def compile_process(self):
        return self.compiler.process()

    def warm_soon(self) -> None:
        self.compiler.warm_soon()

    def build_ahead(self) -> None:
        self.registry.build_ahead()

    def flush_events(self) -> None:
        self.outbox.flush()

    def control(self, req):
        """Answer a request to the engine (gt_core.stream.requests: kind "engine")."""
        if type(req) is SetOptions:
            if req.options.client_match and not self.options.client_match:
                self.registry.republish_plans()
            self.use_options(req.options)
            self.compiler.release_unneeded(self.blocks.values())
        elif type(req) is WaitCompiles:
            for b in list(self.blocks.values()):
                if b.thread is not None:
                    b.thread.join(req.timeout)
            self.flush_events()
        elif type(req) is JitPlan:  # a jit call's block, if its last two calls made the same one
            return self.signals.jit_plan(req.name)
        elif type(req) is Forget:  # the client cleared its events: blocks announce themselves
            self.registry.announced.clear()
        else:
            raise ValueError(
                f"gt engine: expected SetOptions, WaitCompiles, JitPlan or Forget, got {req!r}"
            )
        return None

    def close(self) -> None:
        try:
            self.matcher.flush(mismatch=False)
            self.runner.timings.settle(wait=True)
            self.flush_events()
        finally:  # the compile process and its files go, even when the client has gone
            self.registry.close()
            self.outbox.close()
            self.compiler.close()

    # -- the stream ----------------------------------------------------------------------
    def feed(self, instrs) -> None:
        matcher, signals, history = self.matcher, self.signals, self.history
        for ins in instrs:
            try:
                barrier = ins.code in BARRIERS
                # (no period is searched inside a jit call: its boundaries are known, and
                # its instructions are its block's; after it, see _barrier)
                if barrier and not self._after_barrier and matcher.idle and not signals.jit_open:
                    # Before a barrier (once per run of them) the history most often ends
                    # where a step does (a sync to log every few steps, a batch's uploads):
                    # a step repeated just threshold times between syncs is found there.
                    self._detect(at_barrier=True)
                self._after_barrier = barrier
                self.step(ins)
                if len(history) >= self.next_detect and matcher.idle and not signals.jit_open:
                    self._detect()
            except Exception as exc:  # (the executor fails ops itself: this is gt's own fault)
                self._fault(ins, exc)
        self.runner.timings.settle()  # (runs that ended on the device since: their times)
        self.outbox.flush_soon()

    def _fault(self, ins, exc: Exception) -> None:
        """An instruction raised through the engine: its error at the next sync, its outputs
        never computed, and the session goes on; no instruction ends the worker."""
        outs = getattr(ins, "outs", None) or getattr(ins, "produced", None) or ()
        if self.ex.fail_outputs([o for o in outs if o is not None], exc):
            exc.add_note(f"(gt worker: raised inside gt while running {type(ins).__name__})")

    def step(self, ins) -> None:
        code = ins.code
        if code == DEFOP:
            self.ex.execute(ins)
        elif code == RUN:
            block = self.matcher.blocks[ins.sig]
            produced = ins.produced  # (a list, or a jit call's range: counted in planned)
            occ = self.matcher.planned(block, ins.inputs, produced, ins.scalars)
            if occ is not None:
                self._occurrence(block, occ)
            else:  # the instructions take the ordinary path
                for x in expand(block.form.plan, ins.inputs, produced, ins.scalars):
                    self.step(x)
        elif self.signals.jit_open and code != MARK:
            self._run_and_record(ins)  # a jit call being recorded: its block is the call
        elif not self.matcher.take(ins):
            self._run_and_record(ins)
            if code in BARRIERS:
                self._barrier(ins)

    def _run_and_record(self, ins) -> None:
        """Run one instruction eagerly; it joins the history."""
        code = ins.code
        if code == FREE:
            self.history.remember(ins.vid)
        if code == OP:
            t0 = perf_counter()  # (a hot block's profile: see History.profile)
            result = self.ex.run_op(ins)
            ms = (perf_counter() - t0) * 1e3
        else:
            result, ms = self.ex.execute(ins), None
        self._dropped(self.history.append(ins, result, self.options.window, ms))

    def _dropped(self, dropped: int) -> None:
        if dropped:
            self.next_detect = max(0, self.next_detect - dropped)
            self.signals.shift(dropped)

    def _barrier(self, ins) -> None:
        if ins.code == MARK:
            if self.signals.mark(ins.name, ins.phase, ins.force):
                # A jit call alike its block (an audit, a call recorded again): its
                # instructions are that block's, so no period is searched inside them (an
                # optimizer's per-parameter updates found as a hot path at every audit).
                self.history.clear()
                self.next_detect = 0
                return
        elif ins.code == SYNC and self.options.compile_all:
            self.signals.compile_segment()
        if self.matcher.idle:
            self._detect()

    def _occurrence(self, block, occ) -> None:
        """A complete occurrence: run it.

        A detected block's occurrence joins the history (History.join), so that a longer
        period around it can be found: a run of alike ops inside a step (an optimizer's
        updates of alike parameters, a backward through a chain of alike layers) repeats back
        to back and is found before the step has repeated. A block that a signal or a jit
        call marked starts the period again: the history is cleared.
        """
        self.matcher.expect(block.form.gap)
        if block.form.keys is None:
            self.history.clear()
            self.next_detect = 0
        else:
            self._dropped(self.history.join(block.form, occ, self.options.window))
        self.runner.run(block, occ)

    # -- detection -----------------------------------------------------------------------
    def _detect(self, at_barrier: bool = False) -> None:
        o, n = self.options, len(self.history)
        since = (
            o.threshold * o.min_seq
            if at_barrier
            else max(self.next_detect, o.threshold * o.min_seq)
        )
        if not o.auto_compile or n < since:
            return
        H = self.history
        p = repeating_period(H.hashes, o.threshold, o.min_seq, exact=H.keys)
        if p is None or not self._adopt_period(p):
            self.next_detect = n + max(o.min_seq, 32)

    def _adopt_period(self, p: int) -> bool:
        """Make the block of period ``p`` (unless known) and expect its next occurrence."""
        H = self.history
        c = period_cut(H, self.options, self.ex, p)
        if c is None:
            return False
        try:
            forms = [self.registry.canonicalize(H[b : b + c.length], c.lift) for b in c.occurrences]
        except Mismatch:
            return False
        if len({canon.id for canon, _ in forms}) != 1:
            return False
        canon, namer = forms[-1]
        known = self.blocks.get(canon.id)
        if known is not None and known.retired:
            if nesting.inside_its_loop(known, c.occurrences, self.blocks, H):
                return False  # (the loop around it is searched for as the history grows)
            nesting.revive(known, self.matcher, self.options.client_match)
        self.matcher.expect(c.gap)
        if known is None:
            begin, end = c.occurrences[-1], c.occurrences[-1] + c.length
            paths = H.out_paths_of(range(begin, end))
            dtypes = tuple(namer.dtypes) if c.lift else ()
            block = self.registry.form(canon, namer, paths, p, lift=c.lift, scalar_dtypes=dtypes)
            H.stamp(block, c.occurrences, c.length)
            inner = H.runs_within(c.occurrences, c.length)
            nesting.retire_nested(block, inner, self.blocks, self.matcher)
            H.ran(block.sig, c.occurrences)  # (a longer period may hold these too)
            self.registry.adopt(
                block, len(c.occurrences), recording_t=H.when_recorded(c.occurrences[0])
            )
        return True


def period_cut(H: History, o, ex, p: int):
    """Where the last occurrences of period ``p`` in history ``H`` begin, how long they are
    and what of them is lifted (detector.cut), or None.

    Cut at sync points, and at ops whose arguments change from one period to the next,
    unless only floats change where they can be lifted into tensor inputs. (Detection reads
    the last threshold + 1 periods, and best_cut three: the rest stays unread.)"""

    def unresolved(ins):  # an op the worker cannot find fails every time: no block has it
        return ins.code == OP and ins.op in ex.unresolved

    def lift(a, b):
        return lift_positions(ex.ops[a.op], a, b, H.meta_of)

    def is_view(ins):
        return ex.ops[ins.op].is_view

    instrs = H.read_from(len(H) - (o.threshold + 3) * p)
    lifts, barriers = changes(instrs, p, o.threshold, unresolved, lift)
    since = periodic_since(H.keys, p, o.threshold)
    return cut(instrs, p, o.threshold, o.min_seq, lifts, barriers, since, is_view)
