"""The instruction stream's vocabulary, shared by the client and the worker.

Instructions are small tuples whose first item is an opcode; tensors inside op arguments
are replaced by :class:`Ref` to a value id. Ops travel as small integers defined once per
worker by DEFOP, so a batch carries no op names in the steady state.
"""

from __future__ import annotations

__all__ = ["Ref", "OP", "FREE", "PUT", "SEED", "DEFOP", "MARK", "RUN", "RNG", "BARRIERS", "JIT_SIGNAL", "TensorMeta", "without_ids"]

OP = 0  # (OP, op_index, args, kwargs, out_ids): out_ids[k] is the id of the k-th new tensor output
FREE = 1  # (FREE, id)
PUT = 2  # (PUT, id, cpu_tensor): an upload from the client
SEED = 3  # (SEED, seed): torch.manual_seed on the worker
DEFOP = 4  # (DEFOP, op_index, "aten::add.Tensor", module): module registers it in Python, or None
MARK = 5  # (MARK, signal_name, "enter" | "exit"): a block boundary set by the user
SYNC = 6  # (SYNC, kind): a sync point (the client waited for a value here)
RUN = 7  # (RUN, signature, input_ids, produced_ids, scalars): one whole occurrence of a hot block
# (produced_ids: a list, or an int: the first of the block's consecutive ids, see gt_core.jit)
RNG = 8  # (RNG, state): the CPU generator's state (torch.set_rng_state) on the worker

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


# (shape, stride, storage_offset, dtype): what the client needs to make a proxy.
TensorMeta = tuple


def without_ids(a):
    """An argument with its value ids and float values left out (Ref and float in their
    place): the same for the same op at the same place in each repeat of a step. Floats that
    change every step (Adam's bias corrections, LR schedules) must not hide a repeat; what
    compares them (canonical forms, gt_core.jit's recorded calls) decides what they mean."""
    t = type(a)
    if t is Ref:
        return Ref
    if t is list or t is tuple:
        return tuple(without_ids(x) for x in a)
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
