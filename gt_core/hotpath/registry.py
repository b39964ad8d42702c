"""Making blocks: a segment of the history becomes a registered hot block.

However a block was found (a detected period, a signal, a jit call, compile-every-segment),
it is made here: its canonical form, its ops, its eager graph and its plan for the client;
then it is announced (detected) and, where the options say so, compiled.
"""

from __future__ import annotations

import traceback
from concurrent.futures import ThreadPoolExecutor

from gt_core.compile.lower import build_graph
from gt_core.hotpath.blocks import Block, Blocks
from gt_core.hotpath.form import BlockForm
from gt_core.hotpath.part import Part
from gt_core.observe import events as ev
from gt_core.observe.graph import change
from gt_core.observe.report import Status
from gt_core.observe.status import TRANSITIONS
from gt_core.stream.canonical import Mismatch, canonicalize, finish, value_name
from gt_core.stream.instructions import JIT_SIGNAL
from gt_core.stream.lift import LiftNamer
from gt_core.stream.plan import make_plan

__all__ = ["Registry"]


class Registry(Part):
    """Turns history segments into blocks, registers them in ``blocks`` and announces them."""

    def __init__(self, ex, blocks: Blocks, meta_of, outbox, compiler, options):
        self.ex = ex
        self.blocks = blocks
        self.meta_of = meta_of
        self.outbox = outbox
        self.compiler = compiler
        self.options = options
        self.announced: set[str] = set()  # blocks the client's events say what they are
        self.builder: ThreadPoolExecutor | None = None  # makes eager graphs ahead (build_ahead)

    def build_ahead(self) -> None:
        """From now on each new block's eager graph is made on a thread of its own as soon
        as its plan is out, while the client goes on recording (its check and its first eager
        run need it; made at that first use, it would delay them by the whole build). Only
        where the worker has a process of its own: in the client's process the thread would
        take the interpreter from the user's Python."""
        if self.builder is None:
            self.builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gt-eager-graph")

    def close(self) -> None:
        """No more eager graphs are made ahead (one under way ends first)."""
        if self.builder is not None:
            self.builder.shutdown(wait=True, cancel_futures=True)
            self.builder = None

    def block_op_name(self, idx: int) -> str:
        """op_name for canonicalizing a block: an unresolved op never enters one."""
        if idx in self.ex.unresolved:
            raise Mismatch(f"{self.ex.op_name(idx)} is not known to the worker")
        return self.ex.op_name(idx)

    def canonicalize(self, instrs, lift: dict | None = None):
        """(canonical form, namer) of ``instrs``, floats at ``lift`` made inputs; Mismatch if
        they make no block."""
        if not lift:
            return canonicalize(instrs, self.meta_of, self.block_op_name)
        namer = LiftNamer(self.meta_of, lift)
        entries = tuple(namer.entry(ins, self.block_op_name) for ins in instrs)
        return finish(entries, namer), namer

    def form(self, canon, namer, paths: list, period: int, **kw) -> Block:
        """The block of a canonicalized segment (``kw``: BlockForm's signal, lift,
        scalar_dtypes)."""
        ops, values = self._ops_by_name(), self._value_meta(namer)
        block = Block(BlockForm.of(canon, paths, ops, period, value_meta=values, **kw), self._moved)
        try:  # (how the inputs of the occurrence just seen share memory, if all still alive)
            block.see_inputs(self.ex.lookup(namer.inputs))
        except (KeyError, TypeError):  # unknown: found at its next run (Runner.run)
            block.inputs_gone()
        return block

    def _moved(self, block: Block, was: Status, to: Status) -> None:
        """A block's move, as the report applies it (ev.STATE; from any thread: the compile
        thread moves a block when its compile ends)."""
        why = TRANSITIONS.get(was, {}).get(to)
        self.outbox.emit(ev.STATE, signature=block.sig, status=to.value, was=was.value, why=why)

    def adopt(self, block: Block, occurrences: int = 2, recording_t: float | None = None) -> None:
        """Register a new block and make it hot: announced, compiled where the options say.

        ``recording_t``: when the instructions it was found in began to be recorded (its
        ``recording`` state, as the detected event tells)."""
        self._register(block)
        self._make_hot(block, occurrences, recording_t)

    def republish_plans(self) -> None:
        """Send every plan in use again (the client forgot its plans when it stopped matching)."""
        for block in self.blocks.values():
            if block.form.plan is not None and not block.withdrawn:
                self.outbox.emit(ev.PLAN, signature=block.sig, plan=block.form.plan)

    def _register(self, block: Block) -> None:
        index = {self.ex.op_name(i): i for i in self.ex.ops}
        f = block.form
        plan = make_plan(f.canon, index, len(f.scalar_dtypes))
        block.registered(lambda: self._eager_graph(block), plan)
        self.blocks.add(block)
        if self.options.client_match:
            self.outbox.emit(ev.PLAN, signature=block.sig, plan=block.form.plan)
        if self.builder is not None:
            self.builder.submit(block.make_eager)

    def _eager_graph(self, block: Block):
        """The block's eager form (build_graph without lifting or rewrites, its new tensors
        on the worker's device), or None."""
        try:
            f = block.form
            n = len(f.scalar_dtypes)
            gm = build_graph(
                f.canon, f.ops, f.out_paths, False, n, lift=False, device=self.ex.device
            )
            if self.ex.sharding is not None:  # (every op through the sharding policy)
                self.ex.sharding.wrap_graph(gm)
            return gm
        except Exception:  # the instructions run it (a form FX cannot express)
            if self.options.debug:
                traceback.print_exc()
            return None

    def announce(self, sig: str) -> None:
        """Say what block ``sig`` is and its state, once since the client forgot (Forget),
        before its first event since (Outbox.before): a block known from before a reset
        showed in the report running, or compiled, without its form, graph or state."""
        if sig not in self.announced:
            block = self.blocks.get(sig)
            if block is not None:
                self.announced.add(sig)
                self.outbox.emit(ev.KNOWN, status=block.status.value, **self._form(block))

    def _form(self, block: Block) -> dict:
        """What the detected and known events say of ``block``."""
        f = block.form
        return dict(
            signature=block.sig,
            ops=f.canon.ops,
            n_ops=len(f.canon.ops),
            n_instructions=len(f.canon.entries),
            signal=f.signal,
            canonical=f.canon.to_data(),
            values=f.value_meta,  # (the client draws the graph: gt_core.observe.graph)
            op_ms=f.op_ms,  # its profile: ms per entry (History.profile), or None
        )

    def _make_hot(self, block: Block, occurrences: int, recording_t: float | None) -> None:
        block.move(Status.HOT)
        form = self._form(block)
        data = form["canonical"]
        emit = self.outbox.emit
        self.announced.add(block.sig)
        emit(ev.DETECTED, occurrences=occurrences, recording_t=recording_t, **form)
        for other in self.blocks.values():
            if (
                other is not block
                and other.form.canon.ops == block.form.canon.ops
                and _cut_by(other) == _cut_by(block)
            ):
                c = change(other.form.canon.to_data(), data)  # (None: the same form)
                reason, what = (c.text, c.to_data()) if c else ("same form", None)
                emit(
                    ev.RECOMPILE,
                    signature=block.sig,
                    previous=other.sig,
                    reason=reason,
                    change=what,
                )
                break
        o = self.options
        if block.form.signal or o.compile_all or (o.auto_compile and o.background):
            if block.aliases_unknown:
                block.compile_at_next_run()  # its inputs seen then (Runner.run)
            else:
                self.compiler.schedule(block)
        # Else it compiles on the critical path after a couple of eager occurrences, the
        # baseline that regression detection and the speedup compare against (Runner.run).

    def _value_meta(self, namer) -> dict:
        """{canonical value name: {"shape", "dtype"}} of one occurrence: what the graph shows."""
        out = {}
        for vid, name in namer.names.items():
            m = self.meta_of(vid)
            if m is not None:
                out[value_name(name)] = {
                    "shape": list(m.shape),
                    "dtype": str(m.dtype).removeprefix("torch."),
                }
        return out

    def _ops_by_name(self) -> dict:
        # Without unresolved ops: the compile process resolves every name it is given.
        unresolved = self.ex.unresolved
        return {self.ex.op_name(i): op for i, op in self.ex.ops.items() if i not in unresolved}


def _cut_by(block: Block) -> str | None:
    """What cut a block out of the stream: one jit function's calls (whatever their key), or
    the stream's own period (detected, or a signal).

    A recompile names how a block differs from an earlier one with the same ops, cut the same
    way: a jit call and a detected period of the same step differ by construction (the loss the
    caller drops is freed inside a period, after a call), which no change of the user's code
    would remove.
    """
    s = block.form.signal
    return s.rsplit(":", 1)[0] if s and s.startswith(JIT_SIGNAL) else None
