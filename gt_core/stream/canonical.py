"""Dependency-graph signatures: the canonical form of a block of instructions, and its hash.

Ids are renumbered (external inputs ``in0, in1…`` in order of first use, produced values
``t0, t1…``); the form keeps op overload names, non-tensor arguments, input metadata, which
op consumes which value, and which values are freed inside the block. Two blocks with the
same form compute the same thing on inputs of the same metadata, so the form's hash is the
key of the compiled-block cache: our signature is the guard.

``Canonical.to_data()`` is plain data (it travels in events); gt_core.observe.graph draws and
compares that plain data (``diff``, ``diff_text``), so the client and offline logs can draw
and compare signatures without the worker.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, NamedTuple

from gt_core.stream.instructions import FREE, Ref
from gt_core.stream.meta import ValueMeta, addressed

__all__ = [
    "Canonical",
    "OpEntry",
    "FreeEntry",
    "canonicalize",
    "Namer",
    "signature_of",
]


class OpEntry(NamedTuple):
    """An op of a block. Canonical: ``op`` its name, values named ``("i", k)`` (input k) or
    ``("t", j)`` (produced value j), lists as ``("list", *items)``, ``kwargs`` as (name, value)
    pairs, ``outs`` the names of its new values. In a plan (gt_core.stream.plan): ``op`` its
    index, values as Slots, ``kwargs`` a dict, ``outs`` the produced indices. An output that
    is an input (in place) is None in ``outs`` either way."""

    kind: str  # "op"
    op: Any
    args: tuple
    kwargs: Any
    outs: tuple


class FreeEntry(NamedTuple):
    """A value freed inside the block: its name (canonical) or Slot (in a plan)."""

    kind: str  # "free"
    value: Any


class Mismatch(Exception):
    """An instruction does not fit the expected canonical form."""


class Namer:
    """Assigns canonical names to the ids of a block as its instructions go by."""

    __slots__ = ("names", "inputs", "input_meta", "n_produced", "meta_of")

    def __init__(self, meta_of):
        self.names: dict[int, tuple] = {}  # actual id -> ("i", k) | ("t", j)
        self.inputs: list[int] = []  # actual ids of inputs, in order of first use
        self.input_meta: list[ValueMeta] = []
        self.n_produced = 0
        self.meta_of = meta_of

    def ref(self, vid: int) -> tuple:
        name = self.names.get(vid)
        if name is None:
            meta = self.meta_of(vid)
            if meta is None:
                raise Mismatch(f"value {vid} is unknown")
            name = self.names[vid] = ("i", len(self.inputs))
            self.inputs.append(vid)
            self.input_meta.append(meta)
        return name

    def arg(self, a):
        t = type(a)
        if t is Ref:
            return self.ref(a.id)
        if t is list or t is tuple:
            return (t.__name__, *[self.arg(x) for x in a])
        return a

    def entry(self, ins, op_name) -> OpEntry | FreeEntry:
        """The canonical form of one OP or FREE instruction (binds its new outputs)."""
        if ins.code == FREE:
            return FreeEntry("free", self.ref(ins.vid))
        cargs = tuple([self.arg(a) for a in ins.args])
        ckw = tuple([(k, self.arg(v)) for k, v in ins.kwargs.items()])
        couts = []
        for o in ins.outs:
            if o is None:  # an input returned in place
                couts.append(None)
                continue
            name = self.names[o] = ("t", self.n_produced)
            self.n_produced += 1
            couts.append(name)
        return OpEntry("op", op_name(ins.op), cargs, ckw, tuple(couts))


@dataclass(frozen=True)
class Canonical:
    """A block in canonical form; ``id`` is its signature."""

    entries: tuple  # OpEntry | FreeEntry
    input_meta: tuple  # ValueMeta of each input, in order
    outputs: tuple  # produced names not freed inside the block, in order of production
    id: str

    @property
    def ops(self) -> list[str]:
        return [e.op for e in self.entries if e.kind == "op"]

    def to_data(self) -> dict:
        """Plain data: what events carry and what drawing and diffing read."""
        return {
            "signature": self.id,
            "inputs": [
                {
                    "name": f"in{k}",
                    "shape": list(m.shape),
                    "stride": list(m.stride),
                    "dtype": _dtype(m.dtype),
                    "device": str(m.device),
                }
                for k, m in enumerate(self.input_meta)
            ],
            "entries": [_entry_data(e) for e in self.entries],
            "outputs": [value_name(n) for n in self.outputs],
        }


def canonicalize(instrs, meta_of, op_name) -> tuple[Canonical, Namer]:
    """The canonical form of OP/FREE instructions; ``meta_of(id)`` gives an input's metadata."""
    namer = Namer(meta_of)
    entries = tuple(namer.entry(ins, op_name) for ins in instrs)
    return finish(entries, namer), namer


def finish(entries: tuple, namer: Namer) -> Canonical:
    freed = {e.value for e in entries if e.kind == "free"}
    outputs = tuple(
        n for e in entries if e.kind == "op" for n in e.outs if n is not None and n not in freed
    )
    meta = tuple(namer.input_meta)
    return Canonical(entries, meta, outputs, signature_of(entries, meta))


def signature_of(entries, input_meta) -> str:
    """A short stable id: the first 12 hex digits of a SHA-1 of the canonical form.

    Hashed as plain tuples: a NamedTuple's repr names its class, and a form's id depends on
    what it holds alone; an input's strides as far as they address anything (see
    stream.meta.fits): inputs that fit each other give one id."""
    metas = tuple((m[0], addressed(m[0], m[1]), *m[2:]) for m in input_meta)
    form = (tuple(map(tuple, entries)), metas)
    return hashlib.sha1(repr(form).encode()).hexdigest()[:12]


# -- plain data ---------------------------------------------------------------------------
def _dtype(d) -> str:
    return str(d).removeprefix("torch.")


def value_name(n: tuple) -> str:
    kind, k = n
    return ("in" if kind == "i" else "t") + str(k)


def _arg_data(a):
    if type(a) is tuple and len(a) == 2 and a[0] in ("i", "t") and type(a[1]) is int:
        return "%" + value_name(a)
    if type(a) is tuple and a and a[0] in ("list", "tuple"):
        return [_arg_data(x) for x in a[1:]]
    if isinstance(a, (int, float, str, bool)) or a is None:
        return a
    return repr(a)


def _entry_data(e: OpEntry | FreeEntry) -> dict:
    if e.kind == "free":
        return {"kind": "free", "value": value_name(e.value)}
    return {
        "kind": "op",
        "op": e.op,
        "args": [_arg_data(a) for a in e.args],
        "kwargs": {k: _arg_data(v) for k, v in e.kwargs},
        "outs": [value_name(n) for n in e.outs if n is not None],
    }
