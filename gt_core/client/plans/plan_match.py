"""The client's plan matcher: each recorded instruction matched against the next entry of the
plans the worker sent; a complete occurrence goes out as one RUN (see gt_core.stream.plan).

Plans may share their ops and differ in their inputs' shapes (one step at two batch sizes):
a candidate takes an input only where its metadata fits the plan's (as the worker checks a
RUN's), so each occurrence completes as the plan it fits, and a RUN that cannot fit is not
sent: its instructions go out as they are.
"""

from __future__ import annotations

import time
from collections import deque

from gt_core.client.plans.sites import Siting
from gt_core.observe import metrics
from gt_core.stream.instructions import FREE, OP, RUN, Free, Ref, Run
from gt_core.stream.lift import Scalar
from gt_core.stream.meta import fits
from gt_core.stream.plan import Plan, Slot, instruction

__all__ = ["Candidate", "PlanMatcher"]


class Candidate:
    """One candidate occurrence of a plan in the client's stream: position and bindings."""

    __slots__ = ("plan", "entries", "n", "pos", "inputs", "produced", "scalars", "bound")
    __slots__ += ("siting", "sites", "fit")

    def __init__(self, plan: Plan, siting=None):
        self.plan = plan
        self.entries = plan.entries
        self.n = len(plan.entries)
        self.pos = 0
        self.inputs: list[int] = []
        self.produced: list[int] = []
        self.scalars = [0.0] * plan.n_scalars
        self.bound: set[int] = set()  # ids named so far (an id has one name per occurrence)
        self.fit = plan.input_meta  # (shape, stride, dtype) per input, or () unchecked
        # Where each entry was recorded (gt_core.client.plans.sites), taken in one occurrence of a
        # new plan only: None in all the others.
        self.siting = siting
        self.sites: list | None = None if siting is None else []

    def match(self, ins, proxies=()) -> bool:
        """Whether ``ins`` is the next entry (bound); ``proxies``: its tensor arguments, whose
        metadata a new input must fit."""
        e = self.entries[self.pos]
        if e.kind == "free":
            if ins.code != FREE or not self.bind(e.value, ins.vid):
                return False
        else:
            if ins.code != OP or ins.op != e.op:
                return False
            args, eargs = ins.args, e.args
            if len(args) != len(eargs):
                return False
            for t, a in zip(eargs, args):  # noqa: B905 (lengths checked)
                if not self._arg(t, a, proxies):
                    return False
            kwargs, ekw = ins.kwargs, e.kwargs
            if len(kwargs) != len(ekw):
                return False
            for k, t in ekw.items():
                if k not in kwargs or not self._arg(t, kwargs[k], proxies):
                    return False
            outs, eouts = ins.outs, e.outs
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
        if self.sites is not None:
            self.sites.append(self.siting.here() if e.kind == "op" else None)
        self.pos += 1
        return True

    def sited(self, op: bool) -> None:
        """The next entry was taken without ``match`` (followed or freed): its site."""
        self.sites.append(self.siting.here() if op else None)

    # -- what following a plan needs (see gt_core.client.plans.follow) --------------------------
    def upcoming(self) -> tuple:
        """(what recording the next entry learned or None, the entry)."""
        pos = self.pos
        return self.plan.learned[pos], self.entries[pos]

    def learn(self, pos: int, learned) -> None:
        """Recording entry ``pos`` found ``learned`` (gt_core.client.plans.follow's Learned), what
        later occurrences follow it by."""
        self.plan.learned[pos] = learned

    def lift(self, k: int, value: float) -> None:
        """The occurrence's lifted scalar ``k`` is ``value``."""
        self.scalars[k] = value

    def produce(self, j: int, ids) -> int | None:
        """The entry's output ``j`` takes the next id of ``ids`` (the session's), returned;
        None, and no id taken, where ``j`` is not the next value produced."""
        if j != len(self.produced):
            return None
        vid = next(ids)
        self.produced.append(vid)
        self.bound.add(vid)
        return vid

    def bind(self, slot: Slot, vid: int, meta=None) -> bool:
        """``vid`` takes ``slot``'s name: True where it has that name and no other, and where
        a new input's metadata ``meta`` (a TensorMeta, None: not known) fits the plan's."""
        k = slot.k
        if slot.kind == "t":
            return k < len(self.produced) and self.produced[k] == vid
        if k < len(self.inputs):
            return self.inputs[k] == vid
        if k != len(self.inputs) or vid in self.bound:
            return False
        if meta is not None and self.fit and not fits(meta, self.fit[k]):
            return False
        self.inputs.append(vid)
        self.bound.add(vid)
        return True

    def _arg(self, t, a, proxies) -> bool:
        tt = type(t)
        if tt is Slot:
            if type(a) is not Ref:
                return False
            if proxies and t.kind == "i" and t.k == len(self.inputs):  # a new input
                return self.bind(t, a.id, _meta_of(proxies, a.id))
            return self.bind(t, a.id)
        if tt is list or tt is tuple:
            if type(a) is not tt or len(a) != len(t):
                return False
            for x, y in zip(t, a):  # noqa: B905 (lengths checked)
                if not self._arg(x, y, proxies):
                    return False
            return True
        if tt is Scalar:
            if type(a) is not float and type(a) is not int:
                return False
            self.scalars[t.k] = float(a)
            return True
        return type(a) is tt and a == t


def _meta_of(proxies, vid: int):
    """The metadata of the proxy with id ``vid`` among ``proxies`` (None: not there)."""
    for p in proxies:
        if p.gt_value_id == vid:
            return p.gt_meta
    return None


class PlanMatcher:
    """The client's matcher: instructions in, the stream (with RUNs for whole occurrences) out.

    ``sink(ins)`` appends an instruction to the stream; ``ready()`` is called after a RUN
    (the session flushes, so the worker starts on it at once); ``lines.sites(signature,
    sites)`` once per plan, with where its entries were recorded (gt_core.client.plans.sites);
    ``early.find(plan)``: those sites from what was recorded before the plan came, or None
    (gt_core.client.plans.early_sites).
    """

    def __init__(self, sink, ready, lines=None, early=None):
        self._sink = sink
        self._ready = ready
        self.inbox: deque = deque()  # (signature, Plan | None) from the events thread
        self.live = False  # set once a plan has arrived: until then instructions go straight out
        self.plans: dict[str, Plan] = {}
        self.by_first: dict = {}
        self.cands: list[Candidate] = []
        self.kept: list = []  # the instructions of the occurrence being matched
        self.later: list[int] = []  # values from outside it freed meanwhile (see _later)
        self.runs = 0  # occurrences sent as one RUN
        self.client_ms: dict[str, deque] = {}  # signature -> the client's ms per occurrence
        self.client_runs: dict[str, int] = {}  # signature -> occurrences timed so (all of them)
        self._last: tuple = (None, 0.0)  # the last RUN: its signature and time
        self.followed = 0  # ops recorded by following a plan (see gt_core.client.plans.follow)
        # Plans whose sites are still to take (gt_core.client.plans.sites), and who hears of them.
        self.unsited: dict[str, Siting] = {}
        self.sited: set[str] = set()
        # Where each plan's entries were recorded goes to ``lines.sites`` (gt_core.client.plans.sites)
        self.lines = lines
        self.early = early

    def offer(self, sig: str, plan: Plan | None) -> None:
        """A plan from the worker (None withdraws it); any thread. A block not sited yet is
        first looked for in what was recorded before its plan came: its loop may have
        ended already (gt_core.client.plans.early_sites)."""
        if plan is not None and self.early is not None and sig not in self.sited:
            sites = self.early.find(plan)
            if sites is not None:
                self.sited.add(sig)  # (before the plan is taken: never sited twice)
                if self.lines is not None:
                    self.lines.sites(sig, sites)
        self.inbox.append((sig, plan))
        self.live = True

    def feed(self, ins, proxies=()) -> None:
        """One instruction; ``proxies``: its tensor arguments (their metadata), if any."""
        cands = self.cands
        if not cands:
            self._start(ins, proxies)
            return
        if len(cands) == 1:  # the common case, without the list
            c = cands[0]
            if not c.match(ins, proxies):
                if self._later(ins):
                    return
                self.release()
                self._start(ins, proxies)
                return
            self.kept.append(ins)
            if c.pos == c.n:
                self._complete(c)
            return
        alive = [c for c in cands if c.match(ins, proxies)]
        if not alive:
            if self._later(ins):
                return
            self.release()
            self._start(ins, proxies)
            return
        self.kept.append(ins)
        self.cands = alive
        for c in alive:
            if c.pos == c.n:
                self._complete(c)
                return

    def _later(self, ins) -> bool:
        """A free the plan does not expect here, of a value the occurrence did not make (an
        input it read, or a value it never met), waits for the occurrence's end: the worker
        keeps that value until the block has run, as it must for an input. When a call's
        argument is freed is the interpreter's choice, not the block's: a frame evaluation
        hook (Dynamo's, left installed after a compile error; a debugger's) keeps a call's
        arguments until it returns, where an inlined call frees them with its frame."""
        if ins.code != FREE or any(ins.vid in c.produced for c in self.cands):
            return False
        self.later.append(ins.vid)
        return True

    def _send_later(self) -> None:
        for vid in self.later:
            self._sink(Free(FREE, vid))
        self.later = []

    def free(self, vid: int) -> None:
        """A free: taken as the one candidate's next entry where it names this value (kept
        as None, like a followed op), else fed as an instruction."""
        cands = self.cands
        if len(cands) == 1:
            c = cands[0]
            e = c.entries[c.pos]
            if e.kind == "free" and c.bind(e.value, vid):
                self._took(c, False)
                return
        self.feed(Free(FREE, vid))

    def followed_op(self, c: Candidate) -> None:
        """``c``'s next entry was recorded by following it: kept as None (see release)."""
        self.followed += 1
        self._took(c, True)

    def _took(self, c: Candidate, op: bool) -> None:
        """``c``'s next entry (an op or a free) was taken without ``match``: kept as None."""
        if c.sites is not None:
            c.sited(op)
        c.pos += 1
        self.kept.append(None)
        if c.pos == c.n:
            self._complete(c)

    def _start(self, ins, proxies=()) -> None:
        if self.inbox:
            self._take_inbox()
        code = ins.code
        plans = self.by_first.get(ins.op if code == OP else "free" if code == FREE else None)
        if plans:
            unsited = self.unsited
            cands = [Candidate(p, unsited.get(p.sig)) for p in plans]
            cands = [c for c in cands if c.match(ins, proxies)]
            if cands:
                self.cands = cands
                self.kept.append(ins)
                for c in cands:
                    if c.pos == c.n:
                        self._complete(c)
                        return
                return
        self._sink(ins)

    def _complete(self, c: Candidate) -> None:
        self.cands, self.kept = [], []
        if c.sites is not None and self.unsited.pop(c.plan.sig, None) is not None:
            self.sited.add(c.plan.sig)
            if self.lines is not None:
                self.lines.sites(c.plan.sig, c.sites)
        self.runs += 1
        # The client's ms per occurrence: from one RUN of a block to the next one of it, when
        # nothing else ran between (what gt_core.jit would save, beside the block's own ms).
        now, sig = time.perf_counter(), c.plan.sig
        last_sig, last_at = self._last
        if last_sig == sig:
            self.client_ms.setdefault(sig, deque(maxlen=metrics.CLIENT_SAMPLES)).append(
                (now - last_at) * 1e3
            )
            self.client_runs[sig] = self.client_runs.get(sig, 0) + 1
        self._last = (sig, now)
        self._sink(Run(RUN, c.plan.sig, c.inputs, c.produced, c.scalars))
        if self.later:
            self._send_later()
        self._ready()

    def release(self) -> None:
        """The occurrence in progress did not complete: its instructions go out as they are.

        An op recorded by following the plan (``gt_core.client.plans.follow``) is kept as None: it is its
        entry with the candidate's bindings, rebuilt here.
        """
        kept, cands = self.kept, self.cands
        self.kept, self.cands = [], []
        c = cands[0] if cands else None
        for k, ins in enumerate(kept):
            if ins is None:
                ins = instruction(c.entries[k], c.inputs, c.produced, c.scalars)
            self._sink(ins)
        if self.later:
            self._send_later()

    def forget(self) -> None:
        """Drop every plan and the occurrence in progress (its instructions with it)."""
        self.inbox.clear()
        self.plans.clear()
        self.by_first.clear()
        self.unsited.clear()
        self.cands, self.kept, self.later = [], [], []
        self.live = False

    def _take_inbox(self) -> None:
        while self.inbox:
            sig, plan = self.inbox.popleft()
            old = self.plans.pop(sig, None)
            if old is not None:
                self.by_first[old.first].remove(old)
            if plan is None:
                self.unsited.pop(sig, None)
            else:
                self.plans[sig] = plan
                if sig not in self.sited:
                    self.unsited.setdefault(sig, Siting())
                self.by_first.setdefault(plan.first, []).append(plan)
