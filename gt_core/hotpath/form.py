"""What a hot block is: its canonical form and what follows from it, fixed once it is made.

A block's form never changes; what happens to the block while it runs (its state, its
compiled function, its timings, its retirement) is its Block's (gt_core.hotpath.blocks). Two
facts come after the form is made, each once, and each makes a new form rather than changing
the old one (``dataclasses.replace``, through Block.found_at and Block.registered): where a
detected block was found in the history (its keys, hashes, out paths and op times there), and
the plan the client matches once it is registered.
"""

from __future__ import annotations

import dataclasses

from gt_core.compile import aliases
from gt_core.stream.canonical import Canonical

__all__ = ["BlockForm"]


@dataclasses.dataclass(frozen=True, eq=False)
class BlockForm:
    """A hot block's form: its ops, its graph's parts and what it does to memory."""

    canon: Canonical
    sig: str  # its signature: canon.id
    ops: dict  # op name -> OpOverload
    out_paths: list
    lift: dict  # entry position -> {argument path: dtype}: floats lifted to inputs
    scalar_dtypes: tuple
    value_meta: dict  # value name -> shape and dtype, for the graph
    signal: str | None  # the signal that marked it (None: a detected period)
    gap: int  # instructions between occurrences (barriers)
    # Any in-place op: a failure mid-run may have written some inputs already.
    mutates: bool
    # The inputs it writes in place: only their storages' sharing is what it fits.
    writes: frozenset
    freed_inputs: tuple  # which of an occurrence's freed ids (Occurrence.free_ids) are inputs
    n_produced: int  # values its ops produce (a RUN names that many)
    nones: tuple  # one None an entry (what History.join extends with)
    # Where a detected block was found (History.stamp): its instructions' history keys, their
    # hashes and out paths, which its occurrences join the history with (History.join; None:
    # they clear it), and ms per entry in the eager runs it was found in.
    keys: tuple | None = None
    hashes: tuple = ()
    entry_paths: tuple | None = None
    op_ms: list | None = None
    # Once registered: what the client matches and RUNs carry, and its freed values in order
    # (what a RUN frees).
    plan: object = None
    free_slots: tuple = ()

    @classmethod
    def of(
        cls,
        canon: Canonical,
        out_paths: list,
        ops: dict,
        period: int,
        signal: str | None = None,
        lift: dict | None = None,
        scalar_dtypes: tuple = (),
        value_meta: dict | None = None,
    ) -> BlockForm:
        """The form of ``canon`` found with ``period`` instructions from one occurrence's
        start to the next."""
        frees = [e.value for e in canon.entries if e.kind == "free"]
        return cls(
            canon=canon,
            sig=canon.id,
            ops=ops,
            out_paths=out_paths,
            lift=lift or {},
            scalar_dtypes=scalar_dtypes,
            value_meta=value_meta or {},
            signal=signal,
            gap=period - len(canon.entries),
            mutates=any(ops[name]._schema.is_mutable for name in set(canon.ops)),
            writes=aliases.written(canon, ops),
            freed_inputs=tuple(j for j, name in enumerate(frees) if name[0] == "i"),
            n_produced=sum(
                1 for e in canon.entries if e.kind == "op" for o in e.outs if o is not None
            ),
            nones=(None,) * len(canon.entries),
        )
