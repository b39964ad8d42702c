"""Period detection on synthetic streams: keys and instructions made up here, no worker."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gt_core.hotpath.detector import (
    best_cut,
    changes,
    cut,
    longest_segment,
    periodic_since,
    repeating_period,
    trim,
)
from gt_core.hotpath.history import local_key
from gt_core.stream.instructions import FREE, OP, PUT, SYNC, Free, Op, Put, Ref, Sync

MIN_SEQ = 4


def _periodic(keys: list, p: int) -> bool:
    return all(keys[i] == keys[i + p] for i in range(len(keys) - p))


@st.composite
def repeats(draw, distinct: bool):
    """(noise, block, k, threshold): a stream of noise then k >= threshold repeats of a block.

    ``distinct``: the block's keys all differ (else few keys, so it may repeat inside itself).
    """
    threshold = draw(st.integers(2, 5))
    keys = st.integers(0, 10_000) if distinct else st.integers(0, 3)
    block = draw(st.lists(keys, min_size=MIN_SEQ, max_size=40, unique=distinct))
    k = draw(st.integers(threshold, threshold + 3))
    noise = draw(st.lists(st.integers(-10_000, -1), max_size=30, unique=True))
    return noise, block, k, threshold


@given(repeats(distinct=True))
def test_a_block_repeated_threshold_times_is_found_with_its_period(case):
    noise, block, k, threshold = case
    assert repeating_period(noise + block * k, threshold, MIN_SEQ) == len(block)


@given(repeats(distinct=False))
def test_any_repeated_block_is_found_with_a_period_that_fits_it(case):
    """A block with repeats inside it may have a shorter period: then that one, and the
    stream's tail repeats with it."""
    noise, block, k, threshold = case
    stream = noise + block * k
    p = repeating_period(stream, threshold, MIN_SEQ)
    assert p is not None and MIN_SEQ <= p <= len(block)
    assert _periodic(stream[-threshold * p :], p)


@given(st.lists(st.integers(), unique=True, max_size=300), st.integers(2, 5))
def test_noise_is_not_detected(stream, threshold):
    assert repeating_period(stream, threshold, MIN_SEQ) is None


@given(repeats(distinct=True))
def test_fewer_repeats_than_the_threshold_are_not_detected(case):
    noise, block, _, threshold = case
    assert repeating_period(noise + block * (threshold - 1), threshold, MIN_SEQ) is None


def _period_by_definition(keys: list, t: int, min_seq: int):
    n = len(keys)
    for p in range(min_seq, n // t + 1):
        if _periodic(keys[n - t * p :], p):
            return p
    return None


@given(
    st.lists(st.integers(0, 3), max_size=120)
    | repeats(distinct=False).map(lambda c: c[0] + c[1] * c[2]),
    st.integers(2, 5),
    st.integers(1, 6),
)
def test_the_period_found_is_the_shortest_by_definition(stream, threshold, min_seq):
    want = _period_by_definition(stream, threshold, min_seq)
    assert repeating_period(stream, threshold, min_seq) == want
    # searched on hashes that collide often, confirmed on the keys themselves
    assert repeating_period([k % 2 for k in stream], threshold, min_seq, exact=stream) == want


@given(st.integers(65, 300), st.integers(2, 4), st.data())
def test_a_long_period_with_one_key_changed_however_far_back_is_not_found(p, threshold, data):
    """Periods longer than the keys compared at once (a chunk): a key that differs in any
    of the repeats, the oldest included, breaks the period, on keys and on hashes alike."""
    stream = list(range(p)) * threshold
    assert repeating_period(stream, threshold, MIN_SEQ) == p
    stream[data.draw(st.integers(0, len(stream) - 2))] = -1  # (the last key ends the period)
    assert repeating_period(stream, threshold, MIN_SEQ) is None
    assert repeating_period([k % 2 for k in stream], threshold, MIN_SEQ, exact=stream) is None


def test_periods_shorter_than_min_seq_are_not_blocks():
    assert repeating_period([1, 2, 3] * 10, 3, MIN_SEQ) == 6  # twice the period: long enough
    assert repeating_period([1, 2, 3] * 10, 3, 7) == 9
    assert repeating_period([1, 2] * 4, 3, MIN_SEQ) is None  # too few keys for 3 x 4


# -- instructions: a training-like loop of four ops per step --------------------------------
PARAM = 1  # a value every step reads: it crosses every boundary alike


def _step(base: int, lr: float = 0.1) -> list:
    """x = f(param); y = g(x); free x; z = h(y); free y; param.add_(z, alpha=-lr); free z."""
    x, y, z = base, base + 1, base + 2
    return [
        Op(OP, 0, (Ref(PARAM),), {}, [x]),
        Op(OP, 1, (Ref(x),), {}, [y]),
        Free(FREE, x),
        Op(OP, 2, (Ref(y),), {}, [z]),
        Free(FREE, y),
        Op(OP, 3, (Ref(PARAM), Ref(z)), {"alpha": -lr}, []),
        Free(FREE, z),
    ]


def _stream(steps: int, lrs=None, sync=False) -> list:
    out = []
    for s in range(steps):
        out += _step(100 + 10 * s, lrs[s] if lrs else 0.1)
        if sync:
            out.append(Sync(SYNC, "item"))
    return out


def test_a_loop_is_cut_where_no_value_crosses_the_boundary():
    instrs = _stream(5)[3:]  # starting mid-step: the cut still falls between steps
    keys = [local_key(i) for i in instrs]
    p = repeating_period(keys, 3, MIN_SEQ)
    assert p == 7
    lifts, barriers = changes(instrs, p, 3)
    assert (lifts, barriers) == ({}, [])
    c = cut(instrs, p, 3, MIN_SEQ, lifts, barriers)
    assert c is not None and c.length == 7 and not c.lift
    first = instrs[c.start]
    assert first.code == OP and first.op == 0  # each block begins with a step's first op
    assert [instrs[b][:2] for b in c.occurrences] == [(OP, 0)] * 3  # the last three, whole
    assert c.occurrences == [c.occurrences[0] + i * p for i in range(3)]
    assert c.occurrences[-1] + p <= len(instrs)
    assert (len(instrs) + c.gap - c.start) % p == 0  # the next occurrence starts a period on


@given(st.integers(2, 6), st.integers(0, 6), st.integers(0, 6))
def test_a_loop_is_found_whole_at_every_threshold_wherever_the_history_ends(threshold, head, tail):
    """A step run ``threshold`` + 2 times is a block with ``threshold`` occurrences at any
    threshold, also when the history starts and ends mid-step (a block cut off the period's
    boundary has one complete occurrence fewer than the periods the threshold counts: the
    period before them holds it; at threshold 2 it was no block at all)."""
    instrs = _stream(threshold + 2)
    instrs = instrs[head : len(instrs) - tail]
    keys = [local_key(i) for i in instrs]
    p = repeating_period(keys, threshold, MIN_SEQ)
    assert p == 7
    lifts, barriers = changes(instrs, p, threshold)
    c = cut(instrs, p, threshold, MIN_SEQ, lifts, barriers, periodic_since(keys, p, threshold))
    assert c is not None and c.length == p and instrs[c.start][:2] == (OP, 0)
    assert len(c.occurrences) == threshold
    assert all(instrs[b][:2] == (OP, 0) and b + p <= len(instrs) for b in c.occurrences)


def test_periodic_since_looks_back_one_period_at_most():
    keys = [-1, -2] + [1, 2, 3, 4] * 5
    assert periodic_since(keys, 4, 2) == len(keys) - 3 * 4  # one period before the two
    assert periodic_since(keys, 4, 4) == 2  # where the repeats begin
    assert periodic_since(keys[2:], 4, 5) == 0


def test_best_cut_is_in_the_last_period():
    instrs = _stream(6)
    at = best_cut(instrs, 7)
    assert len(instrs) - 7 <= at < len(instrs) and instrs[at][:2] == (OP, 0)


def test_floats_that_change_each_step_are_lifted_or_cut_at():
    instrs = _stream(4, lrs=[0.1, 0.09, 0.08, 0.07])
    p = 7
    assert repeating_period([local_key(i) for i in instrs], 3, MIN_SEQ) == p  # floats ignored
    add = len(instrs) - 2  # the step's last op, whose alpha changes

    lifts, barriers = changes(instrs, p, 3, lift=lambda a, b: {(1, "alpha"): "float32"})
    assert lifts == {add: {(1, "alpha"): "float32"}} and barriers == []
    c = cut(instrs, p, 3, MIN_SEQ, lifts, barriers)
    assert c.lift == {add - c.start if add >= c.start else add - c.start + p: lifts[add]}

    lifts, barriers = changes(instrs, p, 3)  # nothing can be lifted: the op is a barrier
    assert lifts == {} and barriers == [add]
    c = cut(instrs, p, 3, MIN_SEQ, lifts, barriers)
    # after the op, around to it, without the frees at both ends: op 0 to op 2
    assert c.length == p - 3 and instrs[c.start][:2] == (OP, 0)
    assert instrs[c.start + c.length - 1][:2] == (OP, 2)


def test_a_sync_point_each_step_bounds_the_block():
    instrs = _stream(4, sync=True)
    p = repeating_period([local_key(i) for i in instrs], 3, MIN_SEQ)
    assert p == 8
    lifts, barriers = changes(instrs, p, 3)
    assert barriers == [len(instrs) - 1]
    c = cut(instrs, p, 3, MIN_SEQ, lifts, barriers)
    assert (c.start, c.length, c.gap) == (len(instrs) - p, 6, 0)  # (the step's last free: out)


def test_longest_segment_wraps_around_the_period():
    # barriers at 12 and 14 in the period [10, 20): the longest run is 15..21 (wrapping)
    assert longest_segment([12, 14], 10, 10) == (15, 7)
    assert longest_segment([11, 18], 10, 10) == (12, 6)
    assert longest_segment([19], 10, 10) == (10, 9)  # (20 - 10: the same phase, in the period)


def test_a_block_seen_once_is_no_cut():
    instrs = _stream(3)
    assert cut(instrs, 7, 2, MIN_SEQ, {}, []) is not None
    assert cut(instrs[:10], 7, 2, MIN_SEQ, {}, []) is None  # one complete occurrence at most
    assert cut(instrs, 7, 3, 8, {}, []) is None  # shorter than min_seq


def test_a_period_of_frees_alone_is_no_block():
    """Rows freed after a stack each step repeat as frees only: nothing to run (it was a
    hot path of 0 ops whose compile failed, shown to the user)."""
    instrs = [Free(FREE, v) for v in range(100, 140)]
    keys = [local_key(i) for i in instrs]
    p = repeating_period(keys, 3, MIN_SEQ)
    assert p is not None
    assert cut(instrs, p, 3, MIN_SEQ, {}, []) is None


# -- a stretch between uploads: where the user's variables die is not the block's ----------
VIEW = 9  # the op number of a view (``t`` of a weight)


def _fed_step(base: int, keep_loss: bool) -> list:
    """upload x; h = f(x, W.t()); loss = g(h); grads; W.sub_(...); the next step's W.t().

    ``keep_loss``: the loss lives until the next step's assignment (``loss = step(x)``),
    else it dies as the step returns. Either way the frees of the step's end land among the
    next step's first instructions, before its upload."""
    x, wt, h, loss, g = base, base + 1, base + 2, base + 3, base + 4
    dead = [base - 10 + 3] if keep_loss else [loss]  # the loss before, or this one
    return [
        Put(PUT, x, None),
        Op(OP, 0, (Ref(x), Ref(wt - 10)), {}, [h]),
        Op(OP, 1, (Ref(h),), {}, [loss]),
        Op(OP, 2, (Ref(loss), Ref(h)), {}, [g]),
        Free(FREE, h),
        Op(OP, 3, (Ref(PARAM), Ref(g)), {}, [None]),
        Free(FREE, g),
        Free(FREE, x),
        *[Free(FREE, v) for v in dead],
        Op(OP, VIEW, (Ref(PARAM),), {}, [wt]),
    ]


def test_frees_and_views_at_the_edges_of_a_stretch_stay_out_of_the_block():
    """Two loops running the same step, one keeping its loss until the next step and one
    dropping it, free other values at the stretch's end: the block is the same stretch of
    ops either way, the frees and the next step's view outside it."""
    cuts = []
    for keep in (False, True):
        instrs = [i for s in range(5) for i in _fed_step(100 + 10 * s, keep)]
        keys = [local_key(i) for i in instrs]
        p = repeating_period(keys, 3, 3)
        lifts, barriers = changes(instrs, p, 3)
        c = cut(instrs, p, 3, 3, lifts, barriers, is_view=lambda ins: ins.op == VIEW)
        block = [instrs[c.start + k] for k in range(c.length)]
        cuts.append([(i.code, getattr(i, "op", None)) for i in block])
    assert cuts[0] == cuts[1]
    assert cuts[0][0] == (OP, 0) and cuts[0][-1] == (OP, 3)  # (the write ends it)


@pytest.mark.parametrize("keep", [False, True])
def test_a_stretch_read_past_the_historys_end_leaves_the_next_steps_view_out(keep):
    """The history ends in the middle of a step (detection runs there too), and the stretch
    of the last period wraps to the period before. Its trailing view (the next
    step's ``W.t()``) is the one whose value the stretch's first op reads there: still out
    (it was kept, and a warm-up loop and the loop after it made two blocks)."""
    instrs = [i for s in range(6) for i in _fed_step(100 + 10 * s, keep)][:-8]  # mid-step
    keys = [local_key(i) for i in instrs]
    p = repeating_period(keys, 3, 3)
    lifts, barriers = changes(instrs, p, 3)
    c = cut(instrs, p, 3, 3, lifts, barriers, is_view=lambda ins: ins.op == VIEW)
    block = [instrs[c.occurrences[-1] + k] for k in range(c.length)]
    assert [(i.code, getattr(i, "op", None)) for i in block] == [
        (OP, 0),
        (OP, 1),
        (OP, 2),
        (FREE, None),
        (OP, 3),
    ]


def test_trim_keeps_views_the_stretch_reads_and_ops_that_compute():
    instrs = [
        Free(FREE, 1),
        Op(OP, VIEW, (Ref(PARAM),), {}, [2]),  # read below: stays
        Op(OP, 0, (Ref(2),), {}, [3]),
        Free(FREE, 2),
        Op(OP, 1, (Ref(3),), {}, [4]),  # computes, read by nothing here: stays
        Free(FREE, 3),
        Op(OP, VIEW, (Ref(PARAM),), {}, [5]),  # read by nothing here: out
    ]
    assert trim(instrs, 0, len(instrs), len(instrs), lambda i: i.op == VIEW) == (1, 4)
    assert trim(instrs, 0, len(instrs), len(instrs)) == (1, 6)  # (no view known)
