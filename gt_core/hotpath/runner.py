"""Running a complete occurrence of a block: compiled, as its eager graph, or op by op.

Every timed run goes through ``Runner.timer``; the judge reads what it measures, as soon as
it is known (on a GPU once the run has ended there: gt_core.hotpath.clock), never by waiting.
"""

from __future__ import annotations

from gt_core.compile import aliases
from gt_core.errors import CompiledRunFailed
from gt_core.hotpath import checking, clock
from gt_core.hotpath.blocks import Block, Occurrence
from gt_core.hotpath.outbox import reason
from gt_core.hotpath.part import Part
from gt_core.hotpath.scalar_inputs import ScalarInputs
from gt_core.observe import events as ev
from gt_core.observe.report import Status
from gt_core.stream.instructions import OP

__all__ = ["Runner"]


class Runner(Part):
    """Runs occurrences on the executor and hands their timings to the judge."""

    def __init__(self, ex, outbox, judge, compiler, options):
        self.ex = ex
        self.outbox = outbox
        self.judge = judge
        self.compiler = compiler
        self.options = options
        # Every timed run of a block goes through this one callable, (kind, fn, *args) ->
        # (result, ms or clock.Pending): regression checks judge what it measures, and a test
        # that gives it fixed times per kind gets the judge's decision without depending on
        # the machine.
        self.timer = clock.for_device(ex.device)
        self.timings = clock.Timings()  # (times of runs still running on the device)
        self.agree = _alone  # a first compiled run's check, agreed by a worker group's ranks
        self.said_off: set[str] = set()  # blocks said to run eagerly with compiling off
        self.scalar_inputs = ScalarInputs(ex.device)

    def time_with(self, timer) -> None:
        """Every timed run goes through ``timer`` from now (a test's fixed times)."""
        self.timer = timer

    def joined(self, agree) -> None:
        """A worker group's rank: ``agree(ok)`` is whether a check held on every rank."""
        self.agree = agree

    def run(self, block: Block, occ: Occurrence) -> None:
        """Run an occurrence compiled if we can, else eagerly; compile the block when due."""
        self.timings.settle()  # (the times of earlier runs that have ended, to the judge)
        if block.status == Status.HOT:  # (to compile soon: for how its inputs share memory)
            self._see_aliases(block, occ)
            if block.status == Status.HOT and block.take_compile_due():
                self.compiler.schedule(block)  # (done now where compiles are inline)
        fn = block.fn if self._may_run_compiled(block) else None
        if fn is not None and block.status == Status.COMPILED and not block.judged:
            block.settling()
        inputs = None
        if fn is not None and block.status == Status.COMPILED and not block.probe:
            inputs = self._lookup(occ)
        if inputs is not None and self._fits(block, occ, inputs):
            if not block.checked:
                checking.run_checked(self, block, occ, fn, inputs)
                return
            try:
                self.run_compiled(block, occ, fn, inputs)
            except Exception as exc:
                block.move(Status.FAILED)
                if block.form.mutates:
                    self._failed_midway(block, occ, exc)
                    return
                self.outbox.emit(ev.FALLBACK, signature=block.sig, reason=reason(exc))
            else:
                self.judge.check(block)
                return
        # (as the run begins: its eager graph's first run, a compile beside it; see Judge)
        first, beside = not block.eager_warm, block.status == Status.COMPILING
        ms = self.run_eager(block, occ)
        if ms is not None:
            self.timings.then(ms, lambda ms: self._eager_ran(block, ms, first, beside))

    def _eager_ran(self, block: Block, ms: float, first: bool, beside: bool) -> None:
        self.judge.eager_ran(block, ms, first, beside)
        if block.status == Status.HOT and self.options.auto_compile and len(block.eager_ms) >= 2:
            # Compiling on the critical path: first a couple of eager occurrences, the
            # baseline that regression detection and the speedup compare against.
            self.compiler.schedule(block)

    def _may_run_compiled(self, block: Block) -> bool:
        """Whether the options let ``block`` run compiled: compiling turned off
        (``auto_compile=False``) runs every detected block as its eager graph, those compiled
        before included (a user who turns it off to compare with eager gets eager's graph,
        said once per block); a signal's or jit's block compiles whatever it says."""
        o = self.options
        if block.form.signal or o.auto_compile or o.compile_all or block.fn is None:
            return True
        if block.sig not in self.said_off:
            self.said_off.add(block.sig)
            why = "compiling is off (auto_compile=False): its runs run its eager graph"
            self.outbox.emit(ev.NOTE, signature=block.sig, reason=why)
        return False

    def run_compiled(self, block: Block, occ: Occurrence, fn, inputs=None) -> None:
        if inputs is None:
            inputs = self.ex.lookup(occ.inputs)
        outs, ms, threads = self.call_compiled(block, occ, fn, inputs)
        self.bind(block, occ, outs)
        self.timings.then(ms, lambda ms: self.judge.compiled_ran(block, ms, threads))

    def call_compiled(self, block: Block, occ: Occurrence, fn, inputs: list):
        """One timed call of ``block``'s compiled ``fn`` on an occurrence's ``inputs``, at
        the judge's thread count: (outputs, ms, that count)."""
        args = aliases.call_args(inputs, block.aliases, self.scalars(block, occ))
        with self.judge.threads(block) as threads:
            outs, ms = self.timer("compiled", fn, *args)
        self.scalar_inputs.ran(block.sig, outs)
        return outs, ms, threads

    def _see_aliases(self, block: Block, occ: Occurrence) -> None:
        """Take how this occurrence's inputs share memory as what the block compiles for."""
        try:
            block.see_inputs(self.ex.lookup(occ.inputs))
        except KeyError:
            pass  # (an input missing: the run reports it)
        except TypeError as exc:
            block.move(Status.FAILED)
            self.outbox.emit(ev.COMPILE_FAILED, signature=block.sig, reason=reason(exc))

    def _lookup(self, occ: Occurrence) -> list | None:
        """The occurrence's inputs, or None where one is missing (an op failed earlier: the
        eager run reports it)."""
        try:
            return self.ex.lookup(occ.inputs)
        except KeyError:
            return None

    def _fits(self, block: Block, occ: Occurrence, inputs: list) -> bool:
        """Whether the occurrence's inputs share memory as the compiled block's did (see
        gt_core.compile.aliases). The first time they do not, the block compiles again for
        what they do; after that, such a run runs eagerly (said once)."""
        if self.ex.sharding is not None and aliases.placements(inputs) != block.placements:
            if block.first_placement_miss():  # (compiled for other layouts over the ranks)
                why = (
                    "its inputs are laid out over the ranks otherwise (sharded or whole) than "
                    "it was compiled for: such runs run eagerly"
                )
                self.outbox.emit(ev.NOTE, signature=block.sig, reason=why)
            return False
        now = aliases.key(inputs, block.form.writes)
        want = block.aliases.key if block.aliases is not None else None
        if (want is None and all(type(k) is int for k in now)) or now == want:
            return True
        if not block.realiased:
            block.realias()
            self._see_aliases(block, occ)
            if block.status == Status.COMPILED:
                self.compiler.schedule(block)
            why = "its inputs share memory otherwise than it was compiled for: compiled again"
        elif not block.first_alias_miss():
            return False
        else:
            why = (
                "its inputs share memory otherwise than it was compiled for: such runs run eagerly"
            )
        self.outbox.emit(ev.NOTE, signature=block.sig, reason=why)
        return False

    def scalars(self, block: Block, occ: Occurrence) -> list:
        """The occurrence's lifted scalars as the compiled block takes them (0-d tensors,
        valid until the block's next run: see ScalarInputs)."""
        sharded = self.ex.sharding is not None
        return self.scalar_inputs.of(
            block.sig, occ.scalars, block.form.scalar_dtypes, fresh=sharded
        )

    def run_eager(self, block: Block, occ: Occurrence):
        """Run an occurrence eagerly; its time (Runner.timer's), or None if it failed midway.

        As the block's eager graph where there is one: the same ops with the same arguments
        in the same order as its instructions, so the same results, but called from FX's
        generated code rather than one instruction at a time (fewer Python dispatches per
        op). Else, or where an input is missing (an op failed earlier), its instructions.
        """
        fn = block.eager_fn
        if fn is not None:
            try:
                inputs = self.ex.lookup(occ.inputs)
            except KeyError:
                fn = None
        if fn is None:
            return self.timer("eager", self.run_instructions, occ.instructions)[1]
        try:
            outs, ms = self.timer("eager", fn, *inputs, *occ.scalars)
        except Exception as exc:
            block.eager_failed()
            if not block.form.mutates:  # nothing written yet: the instructions say which op failed
                return self.timer("eager", self.run_instructions, occ.instructions)[1]
            if self.ex.fail_outputs(occ.out_ids, exc):
                exc.add_note(
                    f"(gt worker: raised while running hot path {block.sig} eagerly; the "
                    "tensors it updates in place, parameters and optimizer state, may be "
                    "partly updated)"
                )
            self.ex.drop(occ.free_ids)
            return None
        block.eager_graph_ran()
        self.bind(block, occ, outs)
        return ms

    def run_instructions(self, instrs) -> None:
        """Run an occurrence's instructions one by one."""
        ex = self.ex
        for ins in instrs:
            if ins.code == OP:
                ex.run_op(ins)
            else:
                ex.execute(ins)

    def _failed_midway(self, block: Block, occ: Occurrence, exc: Exception) -> None:
        """A compiled run of a block with in-place updates failed: never re-run it silently.

        Some inputs (parameters, optimizer state) may already hold this step's update, so
        running the instructions again could apply it twice. The user hears of it at the
        next sync; the outputs of this occurrence are marked as never computed.
        """
        why = reason(exc)
        self.outbox.emit(ev.FALLBACK, signature=block.sig, reason=why, midway=True)
        self.ex.fail_outputs(
            occ.out_ids,
            CompiledRunFailed(
                f"gt: the compiled hot path {block.sig} failed while running ({why}). It "
                "updates tensors in place (parameters, optimizer state), which may now be "
                "partly updated, so it was not re-run eagerly. gt runs this block eagerly from "
                "now on; re-create the state (re-run the cell that builds the model and "
                "optimizer) for exact results."
            ),
        )
        self.ex.drop(occ.free_ids)

    def bind(self, block: Block, occ: Occurrence, outs) -> None:
        """An occurrence ran as one call: its outputs bound, its frees dropped."""
        self.ex.bind_outputs(occ.out_ids, outs, block.sig)
        self.ex.drop(occ.free_ids)
        self.ex.count(len(block.form.canon.entries))


def _alone(ok: bool) -> bool:
    return ok
