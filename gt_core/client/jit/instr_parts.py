"""The parts of a recorded instruction two recordings compare: its shape (op and literals,
ids left out), its float arguments, the value ids it refers to."""

from __future__ import annotations

from gt_core.stream.instructions import FREE, OP, PUT, Ref, without_ids

__all__ = ["float_args", "refers", "shape_of"]


def refers(v, ids: dict):
    """The value id in ``ids`` that argument ``v`` refers to, or None."""
    if type(v) is Ref:
        return v.id if v.id in ids else None
    if type(v) in (list, tuple):
        return next((r for r in (refers(x, ids) for x in v) if r is not None), None)
    return None


def shape_of(ins) -> tuple:
    """What of ``ins`` two recordings of one block share: its op, literals, outputs in place."""
    if ins.code == FREE:
        return (FREE,)
    if ins.code == PUT:
        return (PUT,)
    return (
        OP,
        ins.op,
        without_ids(ins.args),
        tuple(sorted((k, without_ids(v)) for k, v in ins.kwargs.items())),
        tuple(o is None for o in ins.outs),
    )


def float_args(ins):
    """(where in words, value, path) of each float argument of ``ins``."""
    for i, a in enumerate(ins.args):
        yield from _floats(a, f"argument {i}", (i,))
    for k, v in ins.kwargs.items():
        yield from _floats(v, k, (k,))


def _floats(a, where, path):
    if type(a) is float:
        yield where, a, path
    elif type(a) in (list, tuple):
        for j, x in enumerate(a):
            yield from _floats(x, f"{where}[{j}]", (*path, j))
