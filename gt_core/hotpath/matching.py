"""Matching the stream against known blocks, instruction by instruction or by a client's RUN.

Where an occurrence of a known block is expected (``gap`` instructions after the last one),
or may begin (after a mismatch the stream realigns with a known block as soon as one begins
again), instructions are matched against the blocks' canonical forms and buffered. A
complete occurrence is handed on; a mismatch mid-block runs the buffered instructions
eagerly: correct, just not faster.
"""

from __future__ import annotations

from gt_core.hotpath.blocks import Block, Blocks, Occurrence, Tracker
from gt_core.observe import events as ev
from gt_core.stream.canonical import Mismatch, Namer
from gt_core.stream.instructions import BARRIERS, FREE, MARK, OP, SYNC

__all__ = ["Matcher"]


class Matcher:
    """The occurrence in progress: the candidate blocks still matching, and the buffer."""

    def __init__(self, blocks: Blocks, meta_of, fits, op_name, outbox, on_occurrence, run_eagerly):
        self.blocks = blocks
        self.meta_of = meta_of
        self.fits = fits  # (ids, metas): whether live values ids have those metadata
        self.op_name = op_name
        self.outbox = outbox
        self.on_occurrence = on_occurrence  # (block, Occurrence): a complete occurrence
        self.run_eagerly = run_eagerly  # (instruction): one that joins no occurrence after all
        self.trackers: list[Tracker] = []
        self.buf: list = []
        self.gap = -1  # instructions to run before the next occurrence; -1: none expected
        self.speculative = False  # the occurrence in progress began where none was expected

    @property
    def idle(self) -> bool:
        """No occurrence in progress or expected: the history may be searched."""
        return self.gap < 0 and not self.trackers

    def expect(self, gap: int) -> None:
        """An occurrence ran: the next one is expected ``gap`` instructions on."""
        self.buf, self.trackers = [], []
        self.gap = gap

    def take(self, ins) -> bool:
        """Whether ``ins`` joined an occurrence; if not, the caller runs it eagerly."""
        code = ins.code
        if self.trackers:
            if code in BARRIERS:
                self.flush(mismatch=True, got=ins)
                return False
            self._track(ins)
            return True
        if self.gap <= 0 and self.blocks.startable:
            self.speculative = self.gap < 0
            if code not in BARRIERS and self._start(ins):
                return True
            self.gap = -1
        elif self.gap > 0:
            self.gap -= 1
        return False

    def planned(self, block: Block, inputs, produced, scalars) -> Occurrence | None:
        """A RUN from the client: the occurrence of ``block`` it names, if its inputs fit.

        Where they do not (same ops, other shapes: a last smaller batch, a new size), the
        client stops using the plan and the caller runs the plan's instructions.
        """
        if self.trackers:  # instructions before it that began to look like a block
            self.flush(mismatch=False)
        if block.retired:  # (a RUN sent before the client heard): its instructions, as they are
            return None
        meta = block.form.canon.input_meta
        if (
            len(inputs) != len(meta)
            or len(produced) != block.form.n_produced
            or not self.fits(inputs, meta)
        ):
            self._withdraw(block)
            return None
        block.occurred()
        return Occurrence.planned(block, inputs, produced, scalars)

    def flush(self, mismatch: bool, got=None) -> None:
        """Run buffered instructions eagerly: the occurrence did not complete."""
        if mismatch and self.trackers and self.buf and not self.speculative:
            t = max(self.trackers, key=lambda t: t.pos)
            if t.pos > 0 or len(self.buf) > 1:
                entries = t.block.form.canon.entries
                expected = _expected(entries[t.pos]) if t.pos < len(entries) else "end"
                self.outbox.emit(
                    ev.MISMATCH,
                    signature=t.block.sig,
                    position=t.pos,
                    expected=str(expected),
                    got=self._describe(got),
                )
        buf, self.buf, self.trackers = self.buf, [], []
        self.gap = -1
        for ins in buf:
            self.run_eagerly(ins)

    def retire(self, block: Block, reason: str, by: str | None = None) -> None:
        """Match ``block`` no more (Blocks.retire), its plan withdrawn; an event says why
        (``by``: the hot path that runs its instructions now)."""
        self.blocks.retire(block, reason, by)
        if block.form.plan is not None and not block.withdrawn:
            self._withdraw(block)
        self.outbox.emit(ev.RETIRED, signature=block.sig, reason=reason, by=by)

    def revive(self, block: Block, reason: str, client_match: bool) -> None:
        """Match the retired ``block`` again, its plan offered to the client again; an event
        says why, and the state it is in (compiled, say)."""
        self.blocks.revive(block)
        if client_match and block.form.plan is not None and block.withdrawn:
            block.offer()
            self.outbox.emit(ev.PLAN, signature=block.sig, plan=block.form.plan)
        self.outbox.emit(ev.REVIVED, signature=block.sig, reason=reason, status=block.status.value)

    def _withdraw(self, block: Block) -> None:
        """The client's matcher stops using ``block``'s plan (its RUNs would not be taken)."""
        block.withdraw()
        self.outbox.emit(ev.PLAN, signature=block.sig, plan=None)

    def _start(self, ins) -> bool:
        if ins.code == FREE and not self.blocks.may_start_with_free():
            return False  # (the frees between a replayed call's RUNs: no naming to try)
        # (an op no block begins with: not named, its inputs' metadata not read)
        if ins.code == OP and not self.blocks.may_start_with_op(self._name(ins.op)):
            return False
        namer = Namer(self.meta_of)
        try:
            first = namer.entry(ins, self.op_name)
        except (Mismatch, KeyError):
            return False
        cands = self.blocks.starting_with(first)
        if not cands:
            return False
        self.trackers = [Tracker(b, self.meta_of) for b in cands]
        self._track(ins)
        return True

    def _name(self, idx: int) -> str | None:
        try:
            return self.op_name(idx)
        except KeyError:  # (an op never defined: Namer.entry fails it alike)
            return None

    def _track(self, ins) -> None:
        self.buf.append(ins)
        alive = [t for t in self.trackers if t.match(ins, self.op_name)]
        if not alive:
            self.flush(mismatch=True, got=ins)
            return
        self.trackers = alive
        done = next((t for t in alive if t.complete), None)
        if done is not None:
            done.block.occurred()
            self.on_occurrence(done.block, Occurrence.tracked(done, self.buf))

    def _describe(self, ins) -> str:
        if ins is None:
            return "end of stream"
        if ins.code == OP:
            return self.op_name(ins.op)
        return {FREE: "free", SYNC: "sync point", MARK: "signal"}.get(ins.code, "upload/seed")


def _expected(e) -> object:
    """What a mismatch event names as expected: the entry's op name, or the freed value."""
    return e.op if e.kind == "op" else e.value
