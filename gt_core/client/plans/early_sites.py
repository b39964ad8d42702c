"""Sites of what a session records before its plans come: a block found as its loop ends.

A block's sites (gt_core.client.plans.sites) are taken in the first occurrence the client matches
after the worker sent the block's plan. A first capture that also starts the worker often
ends before that: the worker is still starting while the loop records, its plan comes after
the loop's last occurrence, and then no op is recorded any more: no stack is left to read.

So while the session's first capture runs, each op the client records as an instruction is
sited as it is recorded (one frame walk, ``Siting.here``), and the newest ``RING``
instructions are kept with their sites. A plan that comes for a block not sited yet is
looked for among them by the matcher's own rules (``plan_match.Candidate``; a free of a
value the occurrence did not make may come in the middle, as the matcher lets it): the first
occurrence found whole (in at most ``TRIES`` starts) gives the block its sites as the plan
arrives, on the events thread. Where none is found (the ring moved past them), the first
occurrence matched live takes them.

Ops followed from a plan (gt_core.client.plans.follow) are never recorded as instructions, and
ops the matcher takes inside an occurrence are not sited: they pay nothing. An occurrence's
first op, which starts the match, is one walk. The window closes at the end of the session's
first capture, or after ``BUDGET`` walks: from then on recording pays one attribute test per
instruction; what is kept goes at the next capture's end. Uploads, seeds and the like are
kept as a mark that no occurrence spans (their data is never kept).
"""

from __future__ import annotations

from collections import deque

from gt_core.client.plans.plan_match import Candidate
from gt_core.client.plans.sites import Siting
from gt_core.stream.instructions import FREE, OP, Free

__all__ = ["EarlySites"]


class EarlySites:
    """The sited instructions of the session's first capture, and the search of a plan there."""

    RING = 16384  # instructions kept, the newest (ops, frees and marks)
    BUDGET = 65536  # ops sited before the window closes
    TRIES = 256  # starts a search tries at most (each costs up to the plan's length)

    def __init__(self):
        self.open = True  # still siting what is recorded
        self.siting = Siting()
        # (instruction or None, site or None), or a freed value's id alone: an int is no
        # object the garbage collector tracks, where a Free and its pair were two per free,
        # and a ring filling up with them made the collector run ever longer passes (the
        # frees are most of what is kept: 0.19 ms of each step of a DataLoader loop)
        self.kept: deque = deque(maxlen=self.RING)
        self.left = self.BUDGET
        self.ended = False  # the first capture has ended

    def take(self, ins) -> None:
        """``ins`` is being recorded: kept, an op with its site (the caller's stack)."""
        code = ins.code
        if code == OP:
            self.kept.append((ins, self.siting.here()))
            self.left -= 1
            if self.left <= 0:
                self.open = False
        elif code == FREE:
            self.kept.append(ins.vid)
        else:  # (an upload's data is not kept; no occurrence spans it)
            self.kept.append((None, None))

    def record(self, matcher, out, ins, proxies) -> bool:
        """``ins`` is being recorded: kept, and into the stream (through ``matcher`` where
        plans are live, else ``out``). Whether it still sites (its budget not spent)."""
        if matcher.live:
            self.feed(matcher, ins, proxies)
        else:
            self.take(ins)
            out(ins)
        return self.open

    def feed(self, matcher, ins, proxies) -> None:
        """``ins``, being recorded while plans are live, to ``matcher``; then kept, sited
        unless the matcher took it inside an occurrence of a plan (as one of its entries
        after the first: its block is known). An occurrence's first op is sited: a later
        mismatch may still send it as an instruction, the start of another block."""
        runs = matcher.runs
        matcher.feed(ins, proxies)
        kept = matcher.kept
        if matcher.runs != runs or (len(kept) > 1 and kept[-1] is ins):
            # (never part of an occurrence found here)
            self.kept.append(ins.vid if ins.code == FREE else (ins, None))
        else:
            self.take(ins)

    def free(self, vid: int) -> None:
        """Value ``vid`` was freed (in the stream's order with the ops)."""
        self.kept.append(vid)

    def close(self) -> None:
        """A capture ended. The first: nothing more is sited, what is kept stays searchable
        (its plans may still be on their way). The next: they have come (its end waited for
        the worker, after the first's), so what is kept goes (a few MB)."""
        if self.ended:
            self.kept.clear()
        self.open, self.ended = False, True
        self.siting = Siting()  # (its forward ops' modules: for backward ops sited later)

    def find(self, plan) -> list | None:
        """The sites of the first whole occurrence of ``plan`` kept (one per entry, None for
        a free), or None where there is none. Any thread: it reads a copy."""
        kept = [(Free(FREE, e), None) if type(e) is int else e for e in list(self.kept)]
        first, tries = plan.first, self.TRIES
        for i, (ins, _) in enumerate(kept):
            if ins is None:
                continue
            code = ins.code
            if (code == OP and ins.op == first) or (code == FREE and first == "free"):
                sites = _occurrence(plan, kept, i)
                if sites is not None:
                    return sites
                tries -= 1
                if not tries:
                    return None
        return None


def _occurrence(plan, kept: list, start: int) -> list | None:
    """The sites of ``plan``'s occurrence starting at ``kept[start]``, None if it is not one."""
    c = Candidate(plan)
    sites: list = []
    for k in range(start, len(kept)):
        ins, site = kept[k]
        if ins is None or (site is None and ins.code == OP):
            return None
        if c.match(ins):
            sites.append(site)  # (None for a free)
            if c.pos == c.n:
                return sites
        elif ins.code != FREE or ins.vid in c.produced:
            return None
        # else: a free of a value from outside the occurrence, which the matcher lets wait
    return None
