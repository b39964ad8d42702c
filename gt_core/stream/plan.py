"""Plans: a hot block as the client sees it, so a whole occurrence travels as one message.

When the worker finds a hot block it sends the client the block's plan: its canonical
entries with op indices, argument templates in which values are slots (``in k`` for the
block's k-th input, ``t k`` for its k-th produced value) and lifted floats are scalars, and
its inputs' shapes, strides and dtypes (a candidate whose input does not fit them ends). The
client matches every instruction it records against the next entry of the plans it holds,
keeping the instructions aside; a complete occurrence becomes one RUN instruction
(``Run``: signature, input ids, produced ids, scalars), sent at once, so the worker runs
step i while the client records step i+1, and neither end pays per op.

A mismatch releases the kept instructions into the stream unchanged: the worker then sees
exactly what it would have seen without plans. The worker checks a RUN's input metadata
against the block's; a RUN that does not fit is expanded back into its instructions (and
the plan is withdrawn from the client), so a plan can make gt faster, never wrong.
"""

from __future__ import annotations

from gt_core.stream.canonical import FreeEntry, OpEntry
from gt_core.stream.instructions import FREE, OP, Free, Op, Ref
from gt_core.stream.lift import Scalar

__all__ = ["Slot", "Plan", "make_plan", "expand", "instruction"]


class Slot:
    """A block's value in a plan: its ``k``-th input (kind "i") or produced value ("t")."""

    __slots__ = ("kind", "k")

    def __init__(self, kind: str, k: int):
        self.kind, self.k = kind, k

    def __repr__(self) -> str:
        return f"%{'in' if self.kind == 'i' else 't'}{self.k}"

    def __reduce__(self):
        return (Slot, (self.kind, self.k))


class Plan:
    """What both ends need to turn an occurrence into one RUN and back into instructions."""

    __slots__ = ("sig", "entries", "n_inputs", "n_scalars", "first", "learned", "input_meta")

    def __init__(
        self, sig: str, entries: tuple, n_inputs: int, n_scalars: int, input_meta: tuple = ()
    ):
        self.sig = sig
        # OpEntry (op index, argument templates, a kwargs dict, produced indices) | FreeEntry
        # (a Slot): see OpEntry.
        self.entries = entries
        self.n_inputs = n_inputs
        self.n_scalars = n_scalars
        e = entries[0]
        self.first = e.op if e.kind == "op" else "free"
        # Client side, per entry: what recording it found once (gt_core.client.plans.follow's
        # Learned), so later occurrences follow the plan without a lookup.
        self.learned: list = [None] * len(entries)
        # (shape, stride, dtype) of each input, as the worker checks a RUN's inputs (the
        # device is the worker's own): several blocks may share their ops and differ only
        # here (one step at two batch sizes), and the client sends each occurrence as the
        # RUN of the plan its inputs fit (gt_core.client.plans.plan_match). Empty: not checked.
        self.input_meta = input_meta

    def __reduce__(self):
        return (Plan, (self.sig, self.entries, self.n_inputs, self.n_scalars, self.input_meta))


def make_plan(canon, op_index: dict[str, int], n_scalars: int) -> Plan:
    """The plan of a block in canonical form; ``op_index`` maps op names to stream indices."""
    entries = []
    for e in canon.entries:
        if e.kind == "free":
            entries.append(FreeEntry("free", _slot(e.value)))
            continue
        entries.append(
            OpEntry(
                "op",
                op_index[e.op],
                tuple(_template(a) for a in e.args),
                {k: _template(v) for k, v in e.kwargs},
                tuple(None if o is None else _slot(o).k for o in e.outs),
            )
        )
    metas = tuple((tuple(m.shape), tuple(m.stride), m.dtype) for m in canon.input_meta)
    return Plan(canon.id, tuple(entries), len(canon.input_meta), n_scalars, metas)


def _slot(name: tuple) -> Slot:
    kind, k = name
    return Slot(kind, k)


def _template(a):
    """A canonical argument as a template: names become Slots, encoded lists lists again."""
    if type(a) is tuple and a:
        if len(a) == 2 and a[0] in ("i", "t") and type(a[1]) is int:
            return _slot(a)
        if a[0] in ("list", "tuple"):
            items = [_template(x) for x in a[1:]]
            return items if a[0] == "list" else tuple(items)
    return a


def expand(plan: Plan, inputs, produced, scalars) -> list:
    """The instructions of one occurrence, given what its RUN bound."""
    return [instruction(e, inputs, produced, scalars) for e in plan.entries]


def instruction(e: OpEntry | FreeEntry, inputs, produced, scalars) -> Op | Free:
    """A plan entry as the instruction it stands for, given the occurrence's bindings."""

    def sub(a):
        t = type(a)
        if t is Slot:
            return Ref(inputs[a.k] if a.kind == "i" else produced[a.k])
        if t is Scalar:
            return scalars[a.k]
        if t is list or t is tuple:
            return t(sub(x) for x in a)
        return a

    if e.kind == "free":
        return Free(FREE, sub(e.value).id)
    return Op(
        OP,
        e.op,
        tuple(sub(a) for a in e.args),
        {k: sub(v) for k, v in e.kwargs.items()},
        tuple(None if o is None else produced[o] for o in e.outs),
    )
