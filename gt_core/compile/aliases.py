"""Inputs of a block that share memory: one base input per storage, views made in the graph.

A training step's block reads a parameter and a view of it saved for the backward (``W.t()``)
as two inputs, and writes the parameter in place at the optimizer step. A compiled graph
assumes its inputs are distinct memory: it may write the parameter before the read of the
view it scheduled later, and the result differs from eager without an error. So where inputs
share a storage, the graph takes that storage once, as a 1-d base, and makes each of those
inputs inside it with ``as_strided``; AOTAutograd then sees the aliasing and keeps eager's
order. The sharing is part of what a compiled block fits: a run whose inputs share memory
otherwise (``key``) runs eagerly.

Only a storage the block writes (an input written in place, directly or through a view:
``written``) is shared in that sense: inputs that overlap and are only read (a BPTT loop's
``x, y = data[i : i + n], data[i + 1 : i + 1 + n]``) are distinct inputs to the graph, and
where in their storage they lie does not matter, so windows at moving offsets are one block.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.fx as fx

__all__ = ["Aliases", "of", "key", "written", "unalias", "call_args", "metas"]

_aten = torch.ops.aten


class Aliases(NamedTuple):
    """How a block's inputs share storages: ``key`` per input (see :func:`key`), and per
    shared storage (numel, dtype, members: ((input, size, stride, offset), ...))."""

    key: tuple
    groups: tuple

    @property
    def members(self) -> frozenset:
        return frozenset(m[0] for g in self.groups for m in g[2])


def key(inputs, writes=None) -> tuple:
    """Per input: the index of the first input sharing its storage, with its offset where
    another input shares it (an empty storage shares nothing). ``writes``: the inputs the
    block writes (see ``written``; None: any may be): a storage none of them is on is
    shared by nothing the graph must know."""
    first: dict = {}
    owner = []
    inputs = [getattr(x, "_local_tensor", x) for x in inputs]  # (a DTensor: this rank's part)
    for k, x in enumerate(inputs):
        st = x.untyped_storage()
        p = st.data_ptr() if st.nbytes() else None
        owner.append(k if p is None else first.setdefault(p, k))
    shared = {j for k, j in enumerate(owner) if j != k}
    if writes is not None:
        shared &= {owner[k] for k in writes if k < len(owner)}
    return tuple((j, inputs[k].storage_offset()) if j in shared else k for k, j in enumerate(owner))


def written(canon, ops: dict) -> frozenset:
    """The inputs a block's ops write in place, directly or through a view of them (its
    canonical entries: gt_core.stream.canonical; ``ops``: op name -> OpOverload)."""
    root: dict = {}  # value name -> the input it views
    out = set()
    for e in canon.entries:
        if e.kind != "op":
            continue
        schema = ops[e.op]._schema
        kwargs = dict(e.kwargs)
        for i, a in enumerate(schema.arguments):
            if a.alias_info is None:
                continue
            v = e.args[i] if i < len(e.args) else kwargs.get(a.name)
            items = v[1:] if type(v) is tuple and v and v[0] == "list" else (v,)
            bases = {
                root.get(x, x) for x in items if type(x) is tuple and x[:1] in (("i",), ("t",))
            }
            inputs = {b[1] for b in bases if b[0] == "i"}
            if a.alias_info.is_write:
                out |= inputs
            elif inputs and schema.returns and schema.returns[0].alias_info is not None:
                for o in e.outs:
                    if o is not None:
                        root[o] = ("i", min(inputs))
    return frozenset(out)


def placements(inputs) -> list:
    """Per input, its DTensor placements over a worker group's ranks (None: a plain tensor,
    whole on every rank): a compiled block is traced for them."""
    return [getattr(t, "placements", None) for t in inputs]


def of(inputs, writes=None) -> Aliases | None:
    """The sharing among ``inputs`` (None where none shares a storage with another that
    matters: see ``key``)."""
    k = key(inputs, writes)
    groups: dict = {}
    for i, entry in enumerate(k):
        if type(entry) is tuple:
            groups.setdefault(entry[0], []).append(i)
    if not groups:
        return None
    out = []
    for members in groups.values():
        x = inputs[members[0]]
        if any(inputs[i].dtype != x.dtype for i in members):
            raise TypeError("inputs of several dtypes share one storage: not compiled")
        numel = x.untyped_storage().nbytes() // x.dtype.itemsize
        views = tuple(
            (i, tuple(inputs[i].shape), tuple(inputs[i].stride()), inputs[i].storage_offset())
            for i in members
        )
        out.append((numel, x.dtype, views))
    return Aliases(k, tuple(out))


def unalias(gm: fx.GraphModule, aliases: Aliases | None) -> fx.GraphModule:
    """The graph taking one base per shared storage (placed after every other input) instead
    of the inputs that share it, which it makes with ``as_strided``."""
    if aliases is None:
        return gm
    g = gm.graph
    holders = list(g.find_nodes(op="placeholder"))
    last = holders[-1]
    bases = []
    for n in range(len(aliases.groups)):
        with g.inserting_after(last):
            last = g.placeholder(f"base{n}")
        bases.append(last)
    for base, (_, _, views) in zip(bases, aliases.groups, strict=True):
        for i, size, stride, offset in views:
            with g.inserting_after(last):
                last = g.call_function(_aten.as_strided.default, (base, size, stride, offset))
            holders[i].replace_all_uses_with(last)
            g.erase_node(holders[i])
    gm.recompile()
    return gm


def _ordered(items: list, aliases: Aliases | None, scalars: list, base) -> list:
    """``items`` (one per input) as the unaliased graph takes them: those that share nothing,
    the scalars, then ``base(numel, dtype, first member's item)`` per shared storage."""
    if aliases is None:
        return [*items, *scalars]
    gone = aliases.members
    out = [x for k, x in enumerate(items) if k not in gone]
    out += scalars
    out += [base(numel, dtype, items[views[0][0]]) for numel, dtype, views in aliases.groups]
    return out


def call_args(inputs: list, aliases: Aliases | None, scalars: list) -> list:
    """The compiled graph's arguments: the inputs that share nothing, the scalars, the bases."""

    def base(numel, dtype, x):
        t = torch.empty(0, dtype=dtype, device=x.device)
        return t.set_(x.untyped_storage(), 0, (numel,), (1,))

    return _ordered(inputs, aliases, scalars, base)


def metas(input_metas: list, aliases: Aliases | None, scalar_metas: list) -> list:
    """The example inputs' (shape, stride, dtype, device) in ``call_args``'s order."""
    return _ordered(
        input_metas, aliases, scalar_metas, lambda numel, dtype, m: ((numel,), (1,), dtype, m[3])
    )
