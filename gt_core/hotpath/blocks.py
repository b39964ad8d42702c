"""Hot blocks, the occurrences of them in progress and complete, and the blocks known so far.

States of a block (named as in the report): hot → compiling → compiled, or failed /
reverted; blocks marked by a signal start as recording. Failed and reverted blocks stay
known (and run eagerly): that keeps the stream aligned, so the same loop is not detected
again at another rotation. A retired block (Blocks.retire: a longer period's block runs its
instructions) stays known too, and is matched no more, until its own period is found again
outside that longer block's runs (Blocks.revive: the stream went back to the loop it was).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from typing import NamedTuple

from gt_core.compile import aliases
from gt_core.hotpath.form import BlockForm
from gt_core.observe.report import Status
from gt_core.observe.status import TRANSITIONS
from gt_core.stream.canonical import Mismatch, Namer
from gt_core.stream.instructions import FREE
from gt_core.stream.lift import LiftNamer
from gt_core.stream.meta import fits
from gt_core.stream.plan import expand

__all__ = ["Block", "Blocks", "Occurrence", "Retirement", "Tracker", "TIMED_RUNS"]

TIMED_RUNS = 1000  # timings a block keeps per series (its memory stays flat over long runs)


class Retirement(NamedTuple):
    """Why a block is matched no more, and the longer block that runs its instructions."""

    reason: str
    by: str | None  # that hot path's signature (None: no block runs them)


class Block:
    """A hot block at run time: its form (what it is, gt_core.hotpath.form) and what happens
    to it: its state, its eager and compiled functions, its timings and checks, its plan's use
    by the client, its retirement."""

    def __init__(self, form: BlockForm, on_move=None):
        self.form = form
        # Told of every move, (block, was, now) as it is made: the engine emits it (ev.STATE).
        self.on_move = on_move
        self.sig = form.sig  # (its name everywhere: the events', the report's, the client's)
        self.status = Status.HOT
        self.fn = None
        self._eager_fn = None  # its eager form (see eager_fn), once made
        self._make_eager = None  # what makes it, until made
        self._eager_lock = threading.Lock()  # (made on the registry's builder thread, or here)
        self.eager_warm = False  # its eager graph has run once (its check, an eager run)
        # Clean eager runs (the baseline of regression checks) and compiled ones: the latest
        # few, as a check reads only those and the client's report has every run's timing.
        self.eager_ms: deque[float] = deque(maxlen=TIMED_RUNS)
        self.compiled_ms: deque[float] = deque(maxlen=TIMED_RUNS)
        self.probe = 0  # eager runs still wanted as a baseline before judging the compiled one
        self.probed = 0  # eager runs timed as such a baseline
        # (kind, the worker's CPU condition) -> ms: what a regression check compares
        self.samples: dict[tuple, deque[float]] = {}
        self.judged = False  # regression check done
        self.checked = False  # its first compiled run was compared with eager (numerics)
        self.compile_due = False  # to compile at its next run, its inputs seen
        self.thread: threading.Thread | None = None
        self.withdrawn = False  # a RUN did not fit: the client no longer uses the plan
        self.occurrences = 0  # occurrences matched since it was found
        self.settle_runs = 0  # its runs since its compiled function came, until a verdict
        # Matched no more (Blocks.retire), apart from its state: a block in any state, failed
        # included, may be retired, and a compile under way may still move it meanwhile; a
        # revival reports the state it is in then.
        self.retirement: Retirement | None = None
        # How its inputs share storages (gt_core.compile.aliases), if they do, and per input
        # its DTensor placements (None: a plain tensor): what it compiles for.
        self.aliases = None
        self.placements = None
        self.placement_miss = False  # a run's inputs were laid out otherwise (said once)
        self.aliases_unknown = False  # its inputs were gone when it was found
        self.realiased = False  # compiled again for how a run's inputs shared memory
        self.alias_miss = False  # a run's inputs shared memory otherwise again (said once)

    @property
    def eager_fn(self):
        """The block's eager form as one generated function (Runner), or None (its
        instructions run it): see make_eager."""
        self.make_eager()
        return self._eager_fn

    @eager_fn.setter
    def eager_fn(self, fn) -> None:
        with self._eager_lock:
            self._eager_fn, self._make_eager = fn, None

    def make_eager(self) -> None:
        """Make its eager form, once: ahead, on the registry's builder thread, or at its
        first use, whichever comes first (a use meanwhile waits for the build under way).
        Never on the way to the block's plan: building the graph (FX over every op) takes
        tens of ms for a large step, and a jit call's client waits for the plan (the builder
        thread shares the interpreter with the thread that answers it)."""
        if self._make_eager is not None:
            with self._eager_lock:
                make = self._make_eager
                if make is not None:
                    self._eager_fn = make()
                    self._make_eager = None

    def eager_graph_ran(self) -> None:
        """Its eager graph ran (its first run, many times slower than later ones, is past)."""
        self.eager_warm = True

    @property
    def eager_made(self) -> bool:
        """Whether its eager form is made (or was let go): using it waits for nothing."""
        return self._make_eager is None

    @property
    def retired(self) -> bool:
        """Whether it is matched no more (its Retirement says why, and who runs it)."""
        return self.retirement is not None

    def move(self, to: Status, eager_too: bool = False) -> None:
        """Enter state ``to`` by the lifecycle's table (gt_core.observe.status.TRANSITIONS);
        staying is no move. Any other move is a bug of gt's, said as one. Failed or reverted,
        its compiled function goes (``eager_too``: its eager graph as well)."""
        if to is not self.status and to not in TRANSITIONS.get(self.status, {}):
            raise RuntimeError(
                f"gt worker: a hot path cannot go from {self.status} to {to} (block {self.sig}); "
                "this is a bug of gt's: please report it"
            )
        was, self.status = self.status, to
        if to is not was and self.on_move is not None:
            self.on_move(self, was, to)
        if to in (Status.FAILED, Status.REVERTED):
            self.fn = None
            if eager_too:
                self.eager_fn = None

    # -- what happens to it (each module that finds out calls one) -----------------------
    def registered(self, make_eager, plan) -> None:
        """Known to the worker: what makes its eager form at its first use (see eager_fn),
        and the plan the client matches (its form with the plan: a form is never changed)."""
        self._eager_fn, self._make_eager = None, make_eager
        slots = tuple(e.value for e in plan.entries if e.kind == "free")
        self.form = dataclasses.replace(self.form, plan=plan, free_slots=slots)

    def found_at(self, op_ms: list, keys: tuple, hashes: tuple, entry_paths: tuple) -> None:
        """Its ops' times where it was found, and its last occurrence's history keys (its
        form with them: a form is never changed)."""
        self.form = dataclasses.replace(
            self.form, op_ms=op_ms, keys=keys, hashes=hashes, entry_paths=entry_paths
        )

    def see_inputs(self, inputs: list) -> None:
        """How the inputs of an occurrence share memory, and their layouts: what it
        compiles for (gt_core.compile.aliases)."""
        self.aliases = aliases.of(inputs, self.form.writes)
        self.placements = aliases.placements(inputs)

    def inputs_gone(self) -> None:
        """Its inputs were gone when it was found: seen at its next run."""
        self.aliases_unknown = True

    def compile_at_next_run(self) -> None:
        self.compile_due = True

    def take_compile_due(self) -> bool:
        """Whether a compile was due at this run (no longer due after)."""
        due, self.compile_due = self.compile_due, False
        return due

    def compiles_in(self, thread: threading.Thread) -> None:
        self.thread = thread

    def compiled(self, fn) -> None:
        """Its compiled function came: it runs compiled (where it still compiles)."""
        self.fn = fn
        if self.status == Status.COMPILING:
            self.move(Status.COMPILED)

    def realias(self) -> None:
        """Compiled again, once, for how a run's inputs share memory: checked again too."""
        self.realiased = True
        self.fn, self.checked = None, False

    def first_placement_miss(self) -> bool:
        """A run's inputs were laid out otherwise than it compiled for: whether for the
        first time (said once)."""
        first, self.placement_miss = not self.placement_miss, True
        return first

    def first_alias_miss(self) -> bool:
        """A run's inputs shared memory otherwise again: whether for the first time."""
        first, self.alias_miss = not self.alias_miss, True
        return first

    def eager_failed(self) -> None:
        """Its eager form raised: its instructions run from now on."""
        self.eager_fn = None

    def checking(self) -> None:
        """Its first compiled run is compared with eager now (numerics), once."""
        self.checked = True

    def want_probes(self, runs: int) -> None:
        """Time ``runs`` eager runs more as a baseline before judging the compiled one."""
        self.probe = runs

    def probed_once(self, warming: bool) -> None:
        """An eager run timed as a probe (one still wanted, where it was its eager graph's
        first run: ``warming``)."""
        self.probed += 1
        if not warming:
            self.probe -= 1

    def judged_now(self) -> None:
        self.judged = True

    def settling(self) -> None:
        """A run with its compiled function at hand and no verdict yet (its check's, the
        judge's probes and timed runs): what settling costs, in runs."""
        self.settle_runs += 1

    def runs_to_settle(self) -> int:
        """Its runs from its compiled function's arrival to its verdict (see settling)."""
        return self.settle_runs

    def occurred(self) -> None:
        """An occurrence of it was matched."""
        self.occurrences += 1

    def retire(self, reason: str, by: str | None) -> None:
        """Matched no more, for ``reason`` (``by``: the block that runs its instructions)."""
        self.retirement = Retirement(reason, by)

    def revive(self) -> None:
        """Matched again: its own loop came back."""
        self.retirement = None

    def withdraw(self) -> None:
        """A RUN did not fit: the client no longer uses its plan."""
        self.withdrawn = True

    def offer(self) -> None:
        """Its plan is offered to the client again."""
        self.withdrawn = False


class Blocks:
    """The blocks known so far, by signature and by what their first instruction looks like."""

    def __init__(self):
        self._by_sig: dict[str, Block] = {}
        self._by_first: dict[tuple, list[Block]] = {}
        self._lift_first: list[Block] = []  # blocks whose first op has a lifted scalar
        self._free_first = False  # whether a block begins with a free
        self._first_ops: frozenset = frozenset()  # the op names blocks in _by_first begin with

    def add(self, block: Block) -> None:
        self._by_sig[block.sig] = block
        self._matchable(block)

    def _matchable(self, block: Block) -> None:
        if 0 in block.form.lift:
            self._lift_first.append(block)
        else:
            first = block.form.canon.entries[0]
            self._by_first.setdefault(first, []).append(block)
            self._free_first = self._free_first or first.kind == "free"
            self._first_ops = _op_names(self._by_first)

    def retire(self, block: Block, reason: str, by: str | None = None) -> None:
        """Match ``block`` no more, for ``reason``. A block found as back-to-back repetitions
        inside a longer period (a run of alike parameters in an optimizer's loop: three found
        in one step, the fourth differs) is part of a larger loop's body: once that loop is
        found (gt_core.hotpath.nesting), the loop's block ``by`` runs its instructions."""
        block.retire(reason, by)
        self._lift_first = [b for b in self._lift_first if b is not block]
        for first, bs in list(self._by_first.items()):
            kept = [b for b in bs if b is not block]
            if kept:
                self._by_first[first] = kept
            else:
                del self._by_first[first]
        self._first_ops = _op_names(self._by_first)

    def revive(self, block: Block) -> None:
        """Match a retired ``block`` again: its own loop came back (gt_core.hotpath.nesting)."""
        if block.retirement is not None:
            block.revive()
            self._matchable(block)

    def get(self, sig) -> Block | None:
        return self._by_sig.get(sig)

    def __getitem__(self, sig: str) -> Block:
        return self._by_sig[sig]

    def __contains__(self, sig) -> bool:
        return sig in self._by_sig

    def values(self):
        return self._by_sig.values()

    @property
    def startable(self) -> bool:
        """Whether any block can begin (the stream is worth matching)."""
        return bool(self._by_first or self._lift_first)

    def may_start_with_free(self) -> bool:
        """Whether a free can begin an occurrence (else a free never starts matching)."""
        return self._free_first

    def may_start_with_op(self, name: str) -> bool:
        """Whether an op named ``name`` can begin an occurrence: a block begins with it, or
        one begins with a lifted scalar (whose first entry any op may fit). Checked before
        an instruction is named, as most instructions begin no block."""
        return name in self._first_ops or bool(self._lift_first)

    def starting_with(self, first) -> list[Block]:
        """The blocks an occurrence beginning with canonical entry ``first`` may be of."""
        return self._by_first.get(first, []) + self._lift_first


def _op_names(by_first: dict) -> frozenset:
    return frozenset(first.op for first in by_first if first.kind == "op")


class Tracker:
    """One occurrence of a block in progress: the position reached and the names bound."""

    __slots__ = ("block", "namer", "pos")

    def __init__(self, block: Block, meta_of):
        self.block = block
        self.namer = LiftNamer(meta_of, block.form.lift) if block.form.lift else Namer(meta_of)
        self.pos = 0

    def match(self, ins, op_name_of) -> bool:
        entries = self.block.form.canon.entries
        try:
            got = self.namer.entry(ins, op_name_of)
        except (Mismatch, KeyError):
            return False
        if got != entries[self.pos]:
            return False
        k = len(self.namer.input_meta)
        if k and not fits(self.namer.input_meta[k - 1], self.block.form.canon.input_meta[k - 1]):
            return False
        self.pos += 1
        return True

    @property
    def complete(self) -> bool:
        return self.pos == len(self.block.form.canon.entries)


class Occurrence:
    """A complete occurrence, however it was found: what running it needs."""

    __slots__ = ("inputs", "scalars", "out_ids", "free_ids", "_instrs", "_expand")

    def __init__(self, inputs, scalars, out_ids, free_ids, instrs=None, expand_=None):
        self.inputs = inputs  # value ids, in the block's input order
        self.scalars = scalars  # lifted floats, in order
        self.out_ids = out_ids  # ids the block's outputs are bound to
        self.free_ids = free_ids  # ids the occurrence frees
        self._instrs, self._expand = instrs, expand_

    @property
    def instructions(self) -> list:
        if self._instrs is None:
            self._instrs = self._expand()
        return self._instrs

    @classmethod
    def tracked(cls, tracker: Tracker, buf: list) -> Occurrence:
        """An occurrence the engine matched instruction by instruction."""
        block = tracker.block
        names = {n: vid for vid, n in tracker.namer.names.items()}
        return cls(
            tracker.namer.inputs,
            getattr(tracker.namer, "scalars", ()),
            [names[n] for n in block.form.canon.outputs],
            [ins.vid for ins in buf if ins.code == FREE],
            instrs=buf,
        )

    @classmethod
    def planned(cls, block: Block, inputs, produced, scalars) -> Occurrence:
        """An occurrence the client matched against the block's plan (a RUN instruction)."""
        return cls(
            inputs,
            scalars,
            [produced[k] for _, k in block.form.canon.outputs],
            [inputs[f.k] if f.kind == "i" else produced[f.k] for f in block.form.free_slots],
            expand_=lambda: expand(block.form.plan, inputs, produced, scalars),
        )
