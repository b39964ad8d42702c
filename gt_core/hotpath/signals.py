"""Blocks the user marks rather than the detector finds: signals, jit calls, every segment.

A user signal (``gt_core.signal``) brackets a segment: seen twice alike, it becomes a block
(compiled if its spec says so). A ``gt_core.jit`` call is a signal named ``JIT_SIGNAL…``:
seen twice alike, the client asks for its block's plan and replays it. With
``compile_all``, the instructions since the previous sync point become a block at once.
"""

from __future__ import annotations

from gt_core.hotpath.part import Part
from gt_core.observe import events as ev
from gt_core.stream.canonical import Mismatch
from gt_core.stream.instructions import BARRIERS, FREE, JIT_SIGNAL, OP, PUT
from gt_core.stream.lift import float_positions

__all__ = ["Signals"]


class Signals(Part):
    """Where each open signal started in the history, and the form each signal last made."""

    def __init__(self, history, registry, outbox, options):
        self.history = history
        self.registry = registry
        self.blocks = registry.blocks
        self.outbox = outbox
        self.options = options
        self.start: dict[str, int] = {}  # open signal -> its position in the history
        self.jit_open = False  # inside a gt_core.jit call being recorded (a "jit:" signal)
        self.jit_ready: dict[str, str] = {}  # jit call name -> its block, seen twice alike
        self.seen: dict[str, str] = {}  # signal name -> the signature its segment last had
        # jit call name -> (its last segment's signature with every liftable float an input,
        # those floats' values): what the next call's floats are compared with
        self.floats: dict[str, tuple] = {}
        # jit call name -> its block with floats lifted, made once the client asks for it
        # (only the client knows whether they are settings it can send: jit_plan)
        self.lifted: dict[str, tuple] = {}

    def shift(self, dropped: int) -> None:
        """The history dropped its oldest ``dropped`` instructions."""
        for s in self.start:
            self.start[s] -= dropped

    def jit_plan(self, name: str):
        """(signature, plan) of a jit call's block if its last two calls made the same one (or
        the same but for floats, lifted: made now)."""
        lifted = self.lifted.pop(name, None)
        if lifted is not None and lifted[0].id == self.seen.get(name):
            canon, namer, paths, period, kw = lifted
            if canon.id not in self.blocks:
                self.registry.adopt(
                    self.registry.form(canon, namer, paths, period, signal=name, **kw)
                )
            self.jit_ready[name] = canon.id
        block = self.blocks.get(self.seen.get(name))
        if block is not None and self.jit_ready.get(name) == block.sig:
            block.offer()
            return block.sig, block.form.plan
        return None

    def mark(self, name: str, phase: str, force: tuple = ()) -> bool:
        """A signal's "enter" or "exit" mark, just recorded in the history. True where it
        ends a jit call whose instructions are its block's (known, or made now)."""
        jit = name.startswith(JIT_SIGNAL)
        if not jit:  # (a jit call's marks are its own events, published by the client)
            self.outbox.emit(ev.SIGNAL, name=name, phase=phase)
        n = len(self.history)
        if phase == "enter":
            self.start[name] = n
            self.jit_open = jit
            return False
        self.jit_open = False
        start = self.start.pop(name, None)
        if start is None or start < 0:
            return False
        H = self.history.read_from(start)  # (read once: each H[i] of History reads it again)
        seg = [i for i in range(start, n - 1) if H[i].code in (OP, FREE)]
        # A jit call's uploads (tensors it makes from host data) are inputs of its block: the
        # client replays it with the values kept, where they were equal on two calls.
        between = (OP, FREE, PUT) if jit else (OP, FREE)
        if not seg or any(H[i].code not in between for i in range(seg[0], seg[-1] + 1)):
            return False
        instrs = [H[i] for i in seg]
        lift = self._jit_lift(name, instrs, force) if jit else None
        try:
            canon, namer = self.registry.canonicalize(instrs, lift)
        except Mismatch:
            return False
        spec = {"compile": True} if jit else self.options.signals.get(name, {})
        # (a lifted segment is alike the last one: they differed only in the lifted floats)
        alike = lift is not None or self.seen.get(name) == canon.id
        if canon.id in self.blocks:
            if jit and alike:
                self.jit_ready[name] = canon.id
            self.seen[name] = canon.id
            return jit and alike
        if alike and spec.get("compile"):
            paths = self.history.out_paths_of(seg)
            if lift:  # made when the client asks for it: the lifted floats are settings it sends
                kw = dict(lift=lift, scalar_dtypes=tuple(namer.dtypes))
                self.lifted[name] = (canon, namer, paths, len(seg) + 2, kw)
                self.seen[name] = canon.id
                return jit
            block = self.registry.form(canon, namer, paths, len(seg) + 2, signal=name)
            self.registry.adopt(block)
            if jit:
                self.jit_ready[name] = block.sig
                self.seen[name] = canon.id
                return True
            else:
                self.outbox.emit(ev.SIGNAL, name=name, phase="compile", signature=canon.id)
        elif not jit and self.seen.get(name) != canon.id:
            # Seen once: recorded, waiting for a second occurrence (or the threshold).
            self.outbox.emit(
                ev.RECORDING, signature=canon.id, ops=canon.ops, n_ops=len(canon.ops), signal=name
            )
        self.seen[name] = canon.id
        return False

    def _jit_lift(self, name: str, instrs: list, force: tuple = ()) -> dict | None:
        """The floats to lift into inputs of a jit call's block: those that differ from the
        call's previous recording, everything else alike (a learning rate a scheduler
        changes every step), and those at ``force`` (liftable ones: numbers the client
        sends each call). None where nothing is lifted, or more than floats differ."""
        ops, meta_of = self.registry.ex.ops, self.history.meta_of
        every = {}
        for pos, ins in enumerate(instrs):
            if ins.code == OP:
                found = float_positions(ops[ins.op], ins, meta_of)
                if found:
                    every[pos] = found
        try:
            canon, namer = self.registry.canonicalize(instrs, every) if every else (None, None)
        except Mismatch:
            canon = None
        last = self.floats.pop(name, None)
        if canon is None:
            return None
        self.floats[name] = (canon.id, namer.scalars)
        if last is None or last[0] != canon.id:
            return None
        changed = {
            k
            for k, (a, b) in enumerate(zip(last[1], namer.scalars, strict=True))
            if a != b and (a == a or b == b)  # (NaN on both calls: alike)
        }
        forced = set(force)
        lift, k = {}, 0  # (the namer numbers the floats in this order)
        for pos, paths in every.items():
            for path, dtype in paths.items():
                if k in changed or (pos, path) in forced:
                    lift.setdefault(pos, {})[path] = dtype
                k += 1
        return lift or None

    def compile_segment(self) -> None:
        """compile_all: the instructions since the previous sync point become a block at once."""
        history = self.history
        n = len(history)
        i = n - 1
        while i > 0 and history[i - 1].code not in BARRIERS:
            i -= 1
        seg = [k for k in range(i, n - 1) if history[k].code in (OP, FREE)]
        if not seg:
            return
        try:
            canon, namer = self.registry.canonicalize([history[k] for k in seg])
        except Mismatch:
            return
        if canon.id not in self.blocks:
            paths = history.out_paths_of(seg)
            block = self.registry.form(canon, namer, paths, len(seg) + 1)
            self.registry.adopt(block, occurrences=1)
