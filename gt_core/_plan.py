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

import time
from collections import deque

from ._instructions import FREE, OP, RUN, Ref
from ._lift import Scalar

__all__ = ["Slot", "Plan", "make_plan", "expand", "instruction", "Replay"]


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


# -- the client's side --------------------------------------------------------------------
class _Occurrence:
    """One candidate occurrence of a plan in the client's stream: position and bindings."""

    __slots__ = ("plan", "entries", "n", "pos", "inputs", "produced", "scalars", "bound")

    def __init__(self, plan: Plan):
        self.plan = plan
        self.entries = plan.entries
        self.n = len(plan.entries)
        self.pos = 0
        self.inputs: list[int] = []
        self.produced: list[int] = []
        self.scalars = [0.0] * plan.n_scalars
        self.bound: set[int] = set()  # ids named so far (an id has one name per occurrence)

    def match(self, ins) -> bool:
        e = self.entries[self.pos]
        if e[0] == "free":
            if ins[0] != FREE or not self._bind(e[1], ins[1]):
                return False
        else:
            if ins[0] != OP or ins[1] != e[1]:
                return False
            args, eargs = ins[2], e[2]
            if len(args) != len(eargs):
                return False
            for t, a in zip(eargs, args):  # noqa: B905 (lengths checked)
                if not self._arg(t, a):
                    return False
            kwargs, ekw = ins[3], e[3]
            if len(kwargs) != len(ekw):
                return False
            for k, t in ekw.items():
                if k not in kwargs or not self._arg(t, kwargs[k]):
                    return False
            outs, eouts = ins[4], e[4]
            if len(outs) != len(eouts):
                return False
            for o, j in zip(outs, eouts):  # noqa: B905 (lengths checked)
                if j is None:
                    if o is not None:
                        return False
                elif j != len(self.produced) or o is None or o in self.bound:
                    return False
                else:
                    self.produced.append(o)
                    self.bound.add(o)
        self.pos += 1
        return True

    def _bind(self, slot: Slot, vid: int) -> bool:
        k = slot.k
        if slot.kind == "t":
            return k < len(self.produced) and self.produced[k] == vid
        if k < len(self.inputs):
            return self.inputs[k] == vid
        if k != len(self.inputs) or vid in self.bound:
            return False
        self.inputs.append(vid)
        self.bound.add(vid)
        return True

    def _arg(self, t, a) -> bool:
        tt = type(t)
        if tt is Slot:
            return type(a) is Ref and self._bind(t, a.id)
        if tt is list or tt is tuple:
            if type(a) is not tt or len(a) != len(t):
                return False
            for x, y in zip(t, a):  # noqa: B905 (lengths checked)
                if not self._arg(x, y):
                    return False
            return True
        if tt is Scalar:
            if type(a) is not float and type(a) is not int:
                return False
            self.scalars[t.k] = float(a)
            return True
        return type(a) is tt and a == t


class Replay:
    """The client's matcher: instructions in, the stream (with RUNs for whole occurrences) out.

    ``sink(ins)`` appends an instruction to the stream; ``ready()`` is called after a RUN
    (the session flushes, so the worker starts on it at once).
    """

    def __init__(self, sink, ready):
        self._sink = sink
        self._ready = ready
        self.inbox: deque = deque()  # (signature, Plan | None) from the events thread
        self.live = False  # set once a plan has arrived: until then instructions go straight out
        self.plans: dict[str, Plan] = {}
        self.by_first: dict = {}
        self.cands: list[_Occurrence] = []
        self.kept: list = []  # the instructions of the occurrence being matched
        self.runs = 0  # occurrences sent as one RUN
        self.client_ms: dict[str, deque] = {}  # signature -> the client's ms per occurrence
        self._last: tuple = (None, 0.0)  # the last RUN: its signature and time
        self.followed = 0  # ops recorded by following a plan (_proxy.follow)

    def offer(self, sig: str, plan: Plan | None) -> None:
        """A plan from the worker (None withdraws it); any thread."""
        self.inbox.append((sig, plan))
        self.live = True

    def feed(self, ins) -> None:
        cands = self.cands
        if not cands:
            self._start(ins)
            return
        if len(cands) == 1:  # the common case, without the list
            c = cands[0]
            if not c.match(ins):
                self.release()
                self._start(ins)
                return
            self.kept.append(ins)
            if c.pos == c.n:
                self._complete(c)
            return
        alive = [c for c in cands if c.match(ins)]
        if not alive:
            self.release()
            self._start(ins)
            return
        self.kept.append(ins)
        self.cands = alive
        for c in alive:
            if c.pos == c.n:
                self._complete(c)
                return

    def free(self, vid: int) -> None:
        """A free: taken as the one candidate's next entry where it names this value (kept
        as None, like a followed op), else fed as an instruction."""
        cands = self.cands
        if len(cands) == 1:
            c = cands[0]
            e = c.entries[c.pos]
            if e[0] == "free" and c._bind(e[1], vid):
                c.pos += 1
                self.kept.append(None)
                if c.pos == c.n:
                    self._complete(c)
                return
        self.feed((FREE, vid))

    def _start(self, ins) -> None:
        if self.inbox:
            self._take_inbox()
        code = ins[0]
        plans = self.by_first.get(ins[1] if code == OP else "free" if code == FREE else None)
        if plans:
            cands = [c for c in (_Occurrence(p) for p in plans) if c.match(ins)]
            if cands:
                self.cands = cands
                self.kept.append(ins)
                for c in cands:
                    if c.pos == c.n:
                        self._complete(c)
                        return
                return
        self._sink(ins)

    def _complete(self, c: _Occurrence) -> None:
        self.cands, self.kept = [], []
        self.runs += 1
        # The client's ms per occurrence: from one RUN of a block to the next one of it, when
        # nothing else ran between (what gt_core.jit would save, beside the block's own ms).
        now, sig = time.perf_counter(), c.plan.sig
        if self._last[0] == sig:
            self.client_ms.setdefault(sig, deque(maxlen=256)).append((now - self._last[1]) * 1e3)
        self._last = (sig, now)
        self._sink((RUN, c.plan.sig, c.inputs, c.produced, c.scalars))
        self._ready()

    def release(self) -> None:
        """The occurrence in progress did not complete: its instructions go out as they are.

        An op recorded by following the plan (``_proxy.follow``) is kept as None: it is its
        entry with the candidate's bindings, rebuilt here.
        """
        kept, cands = self.kept, self.cands
        self.kept, self.cands = [], []
        c = cands[0] if cands else None
        for k, ins in enumerate(kept):
            if ins is None:
                ins = instruction(c.entries[k], c.inputs, c.produced, c.scalars)
            self._sink(ins)

    def forget(self) -> None:
        """Drop every plan and the occurrence in progress (its instructions with it)."""
        self.inbox.clear()
        self.plans.clear()
        self.by_first.clear()
        self.cands, self.kept = [], []
        self.live = False

    def _take_inbox(self) -> None:
        while self.inbox:
            sig, plan = self.inbox.popleft()
            old = self.plans.pop(sig, None)
            if old is not None:
                self.by_first[old.first].remove(old)
            if plan is not None:
                self.plans[sig] = plan
                self.by_first.setdefault(plan.first, []).append(plan)
