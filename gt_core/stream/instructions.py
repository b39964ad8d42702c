"""The instruction stream's vocabulary, shared by the client and the worker.

Each instruction is a NamedTuple whose first field, ``code``, is its opcode (OP, FREE, ...);
tensors inside op arguments are replaced by :class:`Ref` to a value id. Ops travel as small
integers defined once per worker by DEFOP, so a batch carries no op names in the steady state.

On the pipe instructions are plain tuples (``to_wire``/``from_wire``, at the process
transport's two ends): a NamedTuple pickles with a reference to its class and unpickles
through its Python ``__new__``, which costs more per instruction than the conversion, and a
batch carries an instruction per op until a block is hot. The same layout either way: the
wire tuple is the NamedTuple's fields in order, so ``code`` picks the class back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = [
    "Ref",
    "OP",
    "FREE",
    "PUT",
    "SEED",
    "DEFOP",
    "MARK",
    "SYNC",
    "RUN",
    "RNG",
    "Op",
    "Free",
    "Put",
    "Seed",
    "DefOp",
    "Mark",
    "Sync",
    "Run",
    "Rng",
    "BARRIERS",
    "JIT_SIGNAL",
    "to_wire",
    "from_wire",
    "without_ids",
]

OP, FREE, PUT, SEED, DEFOP, MARK, SYNC, RUN, RNG = range(9)


class Op(NamedTuple):
    """Run op number ``op`` (see DefOp) on ``args``/``kwargs``, tensors given as Refs.

    ``outs[k]`` is the id of the k-th tensor output, None where that output is an input
    (returned by an in-place op).
    """

    code: int
    op: int
    args: tuple
    kwargs: dict
    outs: tuple


class Free(NamedTuple):
    """Forget value ``vid``."""

    code: int
    vid: int


class Put(NamedTuple):
    """An upload from the client: value ``vid`` is the CPU tensor ``value``."""

    code: int
    vid: int
    value: Any


class Seed(NamedTuple):
    """torch.manual_seed(``seed``) on the worker."""

    code: int
    seed: int


class DefOp(NamedTuple):
    """Op number ``op`` is ``name`` ("aten::add.Tensor"); ``module`` registered it in
    Python (None: torch's own)."""

    code: int
    op: int
    name: str
    module: str | None = None


class Mark(NamedTuple):
    """A block boundary set by the user: signal ``name``, ``phase`` "enter" or "exit".
    ``force`` (a jit call's exit): (position among the segment's OP and FREE instructions,
    argument path) of floats to lift into inputs of its block even where two calls passed
    the same number: numbers the client computes anew for each call (see jit.settings)."""

    code: int
    name: str
    phase: str
    force: tuple = ()


class Sync(NamedTuple):
    """A sync point: the client waited for a value here (``kind``: what it asked)."""

    code: int
    kind: str


class Run(NamedTuple):
    """One whole occurrence of the hot block ``sig``, bound to these ids and scalars.

    ``produced``: the ids of the values it creates, in order: a list from the plan matcher,
    a range from gt_core.jit (consecutive ids: three ints on the pipe). The worker checks
    their count against the block's.
    """

    code: int
    sig: str
    inputs: list
    produced: Sequence[int]
    scalars: list


class Rng(NamedTuple):
    """The CPU generator's state (torch.set_rng_state) on the worker."""

    code: int
    state: Any


_KINDS = (Op, Free, Put, Seed, DefOp, Mark, Sync, Run, Rng)  # by code
# An instruction built where every microsecond counts (an op recorded, a free, the pipe's
# batches) skips its NamedTuple's Python __new__, which costs several times the tuple itself:
# ``new(Op, (OP, idx, args, kwargs, outs))``, fields in order, nothing checked.
new = tuple.__new__


def to_wire(batch: list) -> list:
    """Instructions as the plain tuples that cross the pipe."""
    return list(map(tuple, batch))


def from_wire(batch: list) -> list:
    """Plain tuples off the pipe as instructions again (each by its code)."""
    return [new(_KINDS[t[0]], t) for t in batch]


# MARK names that begin so are gt_core.jit calls: each call is exactly one block.
JIT_SIGNAL = "jit:"

# Instructions a hot block never spans: the stream is cut there.
BARRIERS = frozenset((PUT, SEED, MARK, SYNC, RNG))


class Ref:
    """A reference to the value with id ``id`` inside op arguments."""

    __slots__ = ("id",)

    def __init__(self, id: int):
        self.id = id

    def __reduce__(self):
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"%{self.id}"

    def __eq__(self, other) -> bool:
        return type(other) is Ref and other.id == self.id

    def __hash__(self) -> int:
        return hash(("Ref", self.id))


def without_ids(a):
    """An argument with its value ids and float values left out (Ref and float in their
    place): the same for the same op at the same place in each repeat of a step. Floats that
    change every step (Adam's bias corrections, LR schedules) must not hide a repeat; what
    compares them (canonical forms, gt_core.jit's recorded calls) decides what they mean."""
    t = type(a)
    if t is Ref:
        return Ref
    if t is list or t is tuple:
        return tuple([without_ids(x) for x in a])
    if t is float:
        return float
    return a


def op_name(op) -> str:
    """'aten.mm.default' for an OpOverload."""
    return f"{op.namespace}.{op._opname}.{op._overloadname}"


def resolve_op(qualified: str):
    """The OpOverload for 'aten::add.Tensor' (the form of ``op._schema`` names)."""
    import torch

    ns, rest = qualified.split("::", 1)
    name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, ns), name)
    return getattr(packet, overload or "default")


def import_op_modules(modules) -> None:
    """Import the modules of the worker_imports option: the ops they register become known.

    A module that fails to import raises ConfigError naming it and its exception.
    """
    import importlib

    from gt_core.errors import ConfigError

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise ConfigError(
                "worker_imports (GT_WORKER_IMPORTS)",
                name,
                "a module the worker process can import; importing it there raised "
                f"{type(exc).__name__}: {exc} (the worker has the client's sys.path at its "
                "start; a module elsewhere needs PYTHONPATH)",
            ) from None


def defining_module(op) -> str | None:
    """The Python module whose ``torch.library.custom_op`` made ``op`` (None: not one)."""
    if op.namespace in ("aten", "prims"):
        return None
    try:
        from torch._library.custom_ops import OPDEFS

        opdef = OPDEFS.get(f"{op.namespace}::{op._opname}")
    except Exception:  # a torch without that registry
        return None
    fn = getattr(opdef, "_init_fn", None)
    return getattr(fn, "__module__", None)


def qualified_name(op) -> str:
    return f"{op.namespace}::{op._opname}.{op._overloadname}"
