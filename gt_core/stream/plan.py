"""Plans: a hot block as the client sees it, so a whole occurrence travels as one message.

When the worker finds a hot block it sends the client the block's plan: its canonical
entries with op indices, argument templates in which values are slots (``in k`` for the
block's k-th input, ``t k`` for its k-th produced value) and lifted floats are scalars. The
client matches every instruction it records against the next entry of the plans it holds,
keeping the instructions aside; a complete occurrence becomes one RUN instruction
``(RUN, signature, input ids, produced ids, scalars)``, sent at once, so the worker runs
step i while the client records step i+1, and neither end pays per op.

A mismatch releases the kept instructions into the stream unchanged: the worker then sees
exactly what it would have seen without plans. The worker checks a RUN's input metadata
against the block's; a RUN that does not fit is expanded back into its instructions (and
the plan is withdrawn from the client), so a plan can make gt faster, never wrong.
"""

from __future__ import annotations

from gt_core.stream.instructions import FREE, OP, Ref
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

    __slots__ = ("sig", "entries", "n_inputs", "n_scalars", "first", "learned")

    def __init__(self, sig: str, entries: tuple, n_inputs: int, n_scalars: int):
        self.sig = sig
        # ("op", op index, args template, kwargs template (dict), outs) | ("free", Slot);
        # outs holds each output's produced index, or None where an input is returned.
        self.entries = entries
        self.n_inputs = n_inputs
        self.n_scalars = n_scalars
        e = entries[0]
        self.first = e[1] if e[0] == "op" else "free"
        # Client side, per entry: what recording it found once, (op, metadata keys of its
        # tensor arguments, its output), so later occurrences follow the plan without a lookup.
        self.learned: list = [None] * len(entries)

    def __reduce__(self):
        return (Plan, (self.sig, self.entries, self.n_inputs, self.n_scalars))


def make_plan(canon, op_index: dict[str, int], n_scalars: int) -> Plan:
    """The plan of a block in canonical form; ``op_index`` maps op names to stream indices."""
    entries = []
    for e in canon.entries:
        if e[0] == "free":
            entries.append(("free", _slot(e[1])))
            continue
        _, name, args, kwargs, outs = e
        entries.append(
            (
                "op",
                op_index[name],
                tuple(_template(a) for a in args),
                {k: _template(v) for k, v in kwargs},
                tuple(None if o is None else o[1] for o in outs),
            )
        )
    return Plan(canon.id, tuple(entries), len(canon.input_meta), n_scalars)


def _slot(name: tuple) -> Slot:
    return Slot(name[0], name[1])


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


def instruction(e: tuple, inputs, produced, scalars) -> tuple:
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

    if e[0] == "free":
        return (FREE, sub(e[1]).id)
    _, idx, args, kwargs, outs = e
    return (
        OP,
        idx,
        tuple(sub(a) for a in args),
        {k: sub(v) for k, v in kwargs.items()},
        tuple(None if o is None else produced[o] for o in outs),
    )
