"""An op's result fitted to the ids the client gave its outputs, as the client inferred them.

The client infers an op's outputs on meta tensors, whose kernels return every output. A real
kernel may return fewer: one that keeps what only a backward needs can leave it out when grad
mode is off, as ``aten.mkldnn_rnn_layer`` (``nn.LSTM`` on the CPU) returns no workspace, and
the worker runs under no_grad. Such an op runs again with grad mode on (no worker tensor
requires grad, so no graph is recorded) and, where that makes its outputs whole, ``GradOn``
stands in for it from then on: in instructions and in hot blocks' eager graphs alike. An
output still missing is not bound; the op that uses it fails, naming both ops.

A sync op's outputs have no ids yet: ``described`` gives them theirs, for the client.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

from gt_core.errors import OutputMismatch, UnsupportedOperation
from gt_core.stream.instructions import Ref, op_name
from gt_core.stream.meta import Made, tensor_meta

__all__ = ["GradOn", "described", "fit", "grad_on"]


class GradOn:
    """An op's stand-in that runs it with grad mode on: called and named like it, its schema."""

    def __init__(self, op):
        self.op = op
        self.namespace, self._opname = op.namespace, op._opname
        self._overloadname, self._schema = op._overloadname, op._schema
        self.is_view = getattr(op, "is_view", False)
        self.__name__ = f"gt_grad_on_{op._opname}"

    def __call__(self, *args, **kwargs):
        with torch.enable_grad():
            return self.op(*args, **kwargs)

    def __repr__(self) -> str:
        return f"GradOn({self.op})"


def fit(op, result, outs) -> tuple[list, list]:
    """([(id, tensor)] to bind, [(position, id)] the client expected and ``result`` lacks).

    ``outs`` has an entry per tensor the client inferred (None where that tensor is an input,
    written in place). The result's tensors pair with them in order; where it has fewer, its
    leaves (a kernel's undefined tensor is None) pair with them position by position. Any
    other count is an OutputMismatch.
    """
    if isinstance(result, torch.Tensor):
        if len(outs) == 1:
            return ([(outs[0], result)] if outs[0] is not None else []), []
        leaves = [result]
    elif not outs:
        return [], []
    else:
        leaves = [x for x in tree_flatten(result)[0] if x is None or isinstance(x, torch.Tensor)]
    tensors = [x for x in leaves if x is not None]
    if len(tensors) == len(outs):
        return [(o, t) for o, t in zip(outs, tensors, strict=True) if o is not None], []
    if len(tensors) < len(outs) == len(leaves):
        pairs = [
            (o, t) for o, t in zip(outs, leaves, strict=True) if o is not None and t is not None
        ]
        paired = enumerate(zip(outs, leaves, strict=True))
        lack = [(k, o) for k, (o, t) in paired if o is not None and t is None]
        return pairs, lack
    raise OutputMismatch(
        f"gt worker: {op_name(op)} returned {len(tensors)} tensors, where the client inferred "
        f"{len(outs)} for it. Run this op outside gt_core.capture() (bring its inputs home "
        "with .cpu()), and report it to gt."
    )


def grad_on(op, call, outs, lack: list):
    """(GradOn(op), result, pairs, lacking) where ``op``, run under no_grad, lacked outputs
    (``lack``) that grad mode on makes, ``call(GradOn(op))`` run again; else None."""
    if torch.is_grad_enabled() or isinstance(op, GradOn) or op._schema.is_mutable:
        return None  # (an op that writes its inputs is not run twice: its writes would repeat)
    stand_in = GradOn(op)
    result = call(stand_in)
    pairs, still = fit(op, result, outs)
    return (stand_in, result, pairs, still) if len(still) < len(lack) else None


def described(op, result, values: tuple, refs: tuple, held: dict, base_id: int):
    """(a sync op's result for the client, the next free id): each new tensor kept in ``held``
    under an id from ``base_id`` on and described (Made), each input it returns named (Ref).

    ``values``: the (args, kwargs) it ran with; ``refs``: the same as sent, with Refs.
    """
    _dense_only(op, result)
    inputs = {
        id(v): r.id
        for v, r in zip(tree_flatten(values)[0], tree_flatten(refs)[0], strict=False)
        if isinstance(r, Ref)
    }
    next_id = [base_id]

    def describe(x):
        if isinstance(x, torch.Tensor):
            if id(x) in inputs:  # in-place: the output is an input
                return Ref(inputs[id(x)])
            vid = next_id[0]
            next_id[0] += 1
            held[vid] = x
            return Made(vid, tensor_meta(x))
        if isinstance(x, (list, tuple)):
            return type(x)(describe(y) for y in x)
        return x

    return describe(result), next_id[0]


def _dense_only(op, result) -> None:
    """A sync op's tensor outputs must be dense (strided): worker tensors are no other kind."""
    for x in tree_flatten(result)[0]:
        if isinstance(x, torch.Tensor) and x.layout != torch.strided:
            raise UnsupportedOperation(
                f"gt: {op_name(op)} made a {x.layout} tensor; worker tensors are dense "
                "(strided) only. Bring the input home first (t.cpu()): ops on plain "
                "tensors run in this process, inside capture too."
            )
