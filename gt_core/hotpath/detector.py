"""Period detection: pure functions over the history's keys and instructions.

``repeating_period`` finds the shortest period whose last occurrences repeat ``threshold``
times in a row; ``periodic_since`` says how far back the keys keep that period; ``changes`` says, over the last period, which instructions differ from one
period to the next (only in floats that can be lifted into inputs, or otherwise: a barrier);
``cut`` then chooses where the block starts and ends within the period. Nothing here reads
a worker: a test can run it on any list of keys and instructions.
"""

from __future__ import annotations

from dataclasses import dataclass

from gt_core.hotpath.history import exact_key, value_ids
from gt_core.stream.instructions import BARRIERS, FREE, OP

__all__ = [
    "Cut",
    "repeating_period",
    "periodic_since",
    "changes",
    "cut",
    "best_cut",
    "longest_segment",
    "trim",
]


@dataclass(frozen=True)
class Cut:
    """Where a block lies in a periodic history, as positions in that history."""

    start: int  # the block's first instruction, in the last period
    length: int  # instructions in the block (the period, unless barriers shorten it)
    occurrences: list[int]  # first instructions of its verified complete occurrences, oldest first
    lift: dict  # position in the block -> {argument path: dtype} of the floats lifted to inputs
    gap: int  # instructions still to run before the next occurrence begins


def repeating_period(
    keys: list, threshold: int, min_seq: int, exact: list | None = None
) -> int | None:
    """The shortest period p >= min_seq whose last ``threshold`` repeats end the keys, or None.

    ``exact``: when given, ``keys`` are its hashes: periods are searched on them and
    confirmed on ``exact`` (a collision costs a comparison, never a wrong period). Only the
    places where the last key occurred before can end a period: ``list.index`` finds them
    (this runs every few dozen instructions over a history of thousands), nearest first;
    the keys just before each are compared before whole periods are.
    """
    n, t = len(keys), threshold
    if n < t * min_seq:
        return None
    found, at, end = [], n - 1 - n // t, n - min_seq
    while True:
        try:
            at = keys.index(keys[-1], at, end)
        except ValueError:
            break
        found.append(at)
        at += 1
    for at in reversed(found):
        p = n - 1 - at
        m = min(3, (t - 1) * p - 1)  # (the keys before the last that lie in the repeats)
        if m > 0 and (keys[at - 1] != keys[n - 2] or keys[at - m : at] != keys[n - 1 - m : n - 1]):
            continue
        lo, hi = n - t * p, n - p
        if _repeats(keys, lo, hi, p) and (exact is None or _repeats(exact, lo, hi, p)):
            return p
    return None


_CHUNK = 64  # keys compared at once: a wrong period fails in its first chunks


def _repeats(keys: list, lo: int, hi: int, p: int) -> bool:
    """Whether ``keys[lo:hi] == keys[lo + p:hi + p]``, compared a chunk at a time from the
    newest back, so that a period that does not repeat costs a few chunks, not two copies
    of ``threshold - 1`` periods."""
    end = hi
    while end > lo:
        start = max(lo, end - _CHUNK)
        if keys[start:end] != keys[start + p : end + p]:
            return False
        end = start
    return True


def periodic_since(keys: list, p: int, threshold: int) -> int:
    """Where the keys' run of period ``p`` begins, up to one period before its last
    ``threshold`` repeats (which ``repeating_period`` found).

    A block cut off the period's boundary has one complete occurrence fewer than the periods
    seen; the period before them, where it repeats too, holds the occurrence missing: without
    it, threshold 2 would leave one occurrence and no block.
    """
    n = len(keys)
    since = n - threshold * p
    floor = max(0, since - p)
    while since > floor and keys[since - 1] == keys[since - 1 + p]:
        since -= 1
    return since


def changes(instrs: list, p: int, threshold: int, is_barrier=None, lift=None):
    """Over the last period: ({index: {path: dtype}} of liftable floats, [barrier indices]).

    ``is_barrier(ins)``: an instruction no block contains (sync points by default);
    ``lift(a, b)``: the argument paths where two calls of one op differ in floats that can
    become inputs, or None (none can, by default).
    """
    n, H = len(instrs), instrs
    lifts: dict[int, dict] = {}
    barriers = []
    for i in range(n - p, n):
        ins = H[i]
        if ins.code in BARRIERS or (is_barrier is not None and is_barrier(ins)):
            barriers.append(i)
            continue
        paths: dict = {}
        for k in range(1, threshold):
            a, b = H[i - (k - 1) * p], H[i - k * p] if i - k * p >= 0 else None
            if b is None or exact_key(a) == exact_key(b):
                continue
            same_op = a.code == OP == b.code and a.op == b.op
            got = lift(a, b) if same_op and lift is not None else None
            if got is None:
                barriers.append(i)
                break
            paths.update(got)
        else:
            if paths:
                lifts[i] = paths
    return lifts, barriers


def cut(
    instrs: list,
    p: int,
    threshold: int,
    min_seq: int,
    lifts: dict,
    barriers: list,
    since: int | None = None,
    is_view=None,
) -> Cut | None:
    """Where the block of period ``p`` lies, or None (too short, or seen fewer than twice).

    Cut at barriers (the longest stretch between them), else where the fewest values cross
    the block's boundary. ``since``: where the instructions start repeating with period ``p``
    (``periodic_since``; by default, the last ``threshold`` periods); the block's occurrences
    are its last ``threshold`` complete ones from there. ``is_view(ins)``: whether an op
    only makes a view (see ``trim``).
    """
    n = len(instrs)
    if barriers:
        start, length = trim(instrs, *longest_segment(barriers, n - p, p), p, is_view)
    else:
        start, length = best_cut(instrs, p), p
    if length < min_seq or not any(
        instrs[j if j < n else j - p].code == OP for j in range(start, start + length)
    ):
        return None  # (frees alone, such as rows dropped after a stack: nothing to run)
    # the most recent complete occurrences of [start, start + length), oldest first
    begin = start if start + length <= n else start - p
    verified = n - threshold * p if since is None else since  # periodic from here on
    occurrences = [begin - k * p for k in range(threshold - 1, -1, -1) if begin - k * p >= verified]
    if len(occurrences) < 2:
        return None
    lift = {}
    for r in range(length):
        j = start + r if start + r < n else start + r - p
        if j in lifts:
            lift[r] = lifts[j]
    gap = start + p - n
    if gap < 0:
        gap += p
    return Cut(start, length, occurrences, lift, gap)


def best_cut(instrs: list, p: int) -> int:
    """The rotation of the period where the fewest values cross the block boundary."""
    n, H = len(instrs), instrs
    # Judge boundaries in a period with a whole period of context on each side, so
    # lifetimes are seen entirely; fall back to the last period when there is no room.
    lo = max(0, n - 3 * p)
    mid = n - 2 * p if n - 3 * p >= 0 else n - p
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i in range(lo, n):
        for vid in value_ids(H[i]):
            first.setdefault(vid, i)
            last[vid] = i
    delta = [0] * (n - lo + 1)
    for vid, f in first.items():
        if last[vid] > f:
            delta[f + 1 - lo] += 1
            delta[last[vid] + 1 - lo] -= 1
    best, best_at, live = None, mid, 0
    for i in range(lo, mid + p):
        live += delta[i - lo]
        if i >= mid and (best is None or live < best):
            best, best_at = live, i
    return best_at + (n - p - mid)  # the same phase, in the last period


def longest_segment(barriers: list[int], lo: int, p: int) -> tuple[int, int]:
    """(start, length) of the longest barrier-free run in one period, wrapping around."""
    best = (barriers[0] + 1, 0)
    for j, b in enumerate(barriers):
        nxt = barriers[j + 1] if j + 1 < len(barriers) else barriers[0] + p
        length = nxt - b - 1
        if length > best[1]:
            best = (b + 1, length)
    start, length = best
    if start >= lo + p:
        start -= p
    return start, length


def trim(instrs: list, start: int, length: int, p: int, is_view=None) -> tuple[int, int]:
    """(start, length) of a stretch between barriers without the frees at its edges.

    Frees at a stretch's edges are where the user's own variables die (a loss kept until the
    next step's assignment, or dropped at once; a batch rebound by the loop): where they land
    follows the user's code, not the step's work, so two loops running the same step would
    make two blocks. The stretch ends at its last op that computes something or whose result
    it reads: trailing frees, and the views among them that only the next stretch reads
    (``is_view(ins)``; the next step's first ``t`` of a weight, before its batch's upload),
    run eagerly, and the block's values they free are its outputs.
    """
    n = len(instrs)

    def at(r):
        j = start + r
        return instrs[j if j < n else j - p]

    # Values the trailing views after the one at hand read. (Only those: an op before a view
    # never reads it, and where the stretch wraps past the history's end, at() reads the
    # period before, whose trailing view is the one this stretch's first op reads.)
    later: set = set()
    end = length
    while end > 0:
        ins = at(end - 1)
        if ins.code == FREE:
            end -= 1
        elif (
            ins.code == OP
            and is_view is not None
            and is_view(ins)
            and not any(v in later for v in ins.outs)
        ):
            later.update(v for v in value_ids(ins) if v not in ins.outs)
            end -= 1
        else:
            break
    lead = 0
    while lead < end and at(lead).code == FREE:
        lead += 1
    first = start + lead
    return (first if first < n else first - p), end - lead  # (in the last period, as given)
