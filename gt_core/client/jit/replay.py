"""A replayed call: the block's inputs read where the recipe says, one RUN, outputs put back.

The inputs are read in flat passes where everything is as the last calls found it (the
steady state: ``inputs_fast``), else each is checked (``inputs``); one that no longer fits
sends the call back to its Python (the entry's ``unfit`` transition).
"""

from __future__ import annotations

import operator

import torch
from torch.utils._pytree import tree_unflatten

from gt_core.client.jit.recipe import OUT
from gt_core.client.recording.meta import where_free_key
from gt_core.client.recording.proxy import Proxy
from gt_core.client.recording.proxy_fields import drop_shadow
from gt_core.client.session import LOCK
from gt_core.stream.instructions import FREE, OP, RUN, Free, Ref, Run

__all__ = ["run", "inputs", "bound", "unflatten", "UNFIT", "IN_FLIGHT"]

IN_FLIGHT = 32  # replayed calls the worker may be behind by before a call waits for it
MARK_EVERY = 8  # a progress mark is posted every this many replayed calls
UNFIT = object()  # what ``run`` returns when an input no longer fits (the call runs instead)
# A fitting input: (session, metadata key, its shadow: None, or one jit.program keeps)
_FACTS = operator.attrgetter("gt_session", "gt_meta_key", "gt_shadow")
_ID = operator.attrgetter("gt_value_id")


def unflatten(leaves, spec):
    """(args, kwargs) from the call's leaves: ``spec`` is a pytree spec, or the number of
    proxies passed positionally (the common case, flattened without pytree)."""
    if type(spec) is int:
        return tuple(leaves), {}
    return tree_unflatten(leaves, spec)


def run(entry, leaves):
    """Send one RUN for this call; its result (UNFIT: an input no longer fits)."""
    s, r = entry.session, entry.recipe
    with LOCK:
        s.check()
        ids = _inputs_fast(entry, leaves)
        if ids is None:
            ids = inputs(entry, leaves)
            if ids is None:
                return UNFIT
        produced = s.new_ids(r.n_produced)  # (a range: consecutive ids)
        if s.matcher.kept:
            s.matcher.release()
        out, freed = s.out, s.freed  # (out: a jit call being recorded sees them too)
        while freed:  # straight out: the RUN after them ends any occurrence they start
            out(Free(FREE, freed.popleft()))
        out(Run(RUN, r.sig, ids, produced, entry.scalars_now))
        for k in r.let_go:  # (what the call freed on its way out, after the block)
            out(Free(FREE, produced[k]))
        s.send_now()
        if entry.rerun is not None:  # (the block did to the worker's values what it did)
            entry.rerun.commit()
        entry.ran()
        outs = [None if m is None else Proxy(s, produced[k], m) for k, m in r.outputs]
        for place in r.cleared:
            place.write(None)
        for place, j in r.placed:
            place.write(outs[j])
    for sched, n in r.schedulers:  # (stepped inside the step: its Python, after the RUN)
        for _ in range(n):
            sched.step()
    if r.single is not None:
        return outs[r.single]
    res_leaves = [outs[x[1]] if type(x) is tuple and x and x[0] is OUT else x for x in r.result]
    return tree_unflatten(res_leaves, r.result_spec)


def _inputs_fast(entry, leaves) -> list | None:
    """The inputs' ids when every root and input is as the last calls found them (the
    steady state), read in flat passes; None sends the call to ``inputs``."""
    r = entry.recipe
    try:
        roots = [g(o, k) for g, o, k in r.root_readers]
        got = [leaves[k] if g is None else g(o, k) for g, o, k in r.readers]
        facts = list(map(_FACTS, got))  # (AttributeError: not a proxy)
        seen = [_key(g(o, k)) for g, o, k in r.seen_readers]
        held = [g(o, k) for g, o, k in r.holder_readers]
        aliased = all(g(o, k) is got[i] for (g, o, k), i, _ in r.aliases)
    except Exception:
        return None
    if facts != entry.facts or not all(map(operator.is_, roots, r.root_objs)):
        return None
    if seen != r.seen_keys or not aliased or not all(map(operator.is_, held, r.holder_objs)):
        return None
    return list(map(_ID, got))


def _key_of(src, p) -> int:
    """An input's metadata key as the recipe holds it (an argument's wherever it begins)."""
    return where_free_key(p) if type(src) is int else p.gt_meta_key


def inputs(entry, leaves) -> list | None:
    """The inputs' ids, each checked (None: one no longer fits; the function runs)."""
    s, r = entry.session, entry.recipe
    for place, obj in r.roots:
        if place.read() is not obj:  # a global or closure name bound to another object
            entry.unfit(place, obj, None)
            return None
    for place, obj in r.holders:  # (each container where the walk found it)
        if place.read() is not obj:
            entry.unfit(place, place.read(), None, what="it holds another object than its state")
            return None
    for place, was in r.seen:  # (the other slots, as the recorded call found them)
        now = place.read()
        if _key(now) != was:
            entry.unfit(place, now, was, what=_seen_now(now, was))
            return None
    kept = {id(p) for p, _ in entry.rerun.targets} if entry.rerun is not None else ()
    got = []
    empty = []  # (index, place) of .grads to fill with zeros once the rest fit
    for src, k in r.inputs:
        p = leaves[src] if type(src) is int else src.read()
        if p is None and _a_grad(src):
            empty.append((len(got), src))
        elif type(p) is not Proxy or p.gt_session is not s or _key_of(src, p) != k:
            entry.unfit(src, p, k)
            return None
        elif type(src) is int and r.arg_offsets is not None and p.gt_meta[3] != r.arg_offsets[src]:
            was = r.arg_offsets[src]
            entry.unfit(src, p, k, what=f"at storage offset {p.gt_meta[3]}, recorded at {was}")
            return None
        elif p.gt_shadow is not None and id(p) not in kept:
            drop_shadow(p)  # its shadow would not follow the block (jit.program's do)
        got.append(p)
    for i, place in empty:
        got[i] = zeros = torch.zeros_like(place.obj)
        if zeros.gt_meta_key != r.inputs[i][1]:
            entry.unfit(place, zeros, r.inputs[i][1])
            return None
    for _, i, place in r.aliases:  # (one tensor in two places, as recorded)
        if place.read() is not got[i]:
            entry.unfit(
                place,
                place.read(),
                None,
                what="it holds another tensor than the one the block reads for it",
            )
            return None
    for i, place in empty:  # (written once all fit: a call that runs instead finds them empty)
        place.write(got[i])
    entry.fitted(list(map(_FACTS, got)))
    return list(map(_ID, got))


def _a_grad(src) -> bool:
    """Whether input ``src`` is the .grad of a tensor that requires grad. The block adds to
    it (backward accumulates); a replay that finds it empty (zero_grad(set_to_none=True)
    since) fills it with zeros first, so one block serves the first micro-batch after
    zero_grad and those that accumulate: 0 + g is g (a -0.0 becomes +0.0)."""
    return (
        type(src) is not int
        and src.how == "attr"
        and src.key == "grad"
        and type(src.obj) is Proxy
        and src.obj.requires_grad
    )


def fill_grads(last) -> list:
    """Before a call is recorded: the .grads the ``last`` recorded call found filled and
    this one finds empty, filled with zeros ([(place, zeros)]), so that calls alternating
    between a first micro-batch and accumulating ones record one block (see _a_grad)."""
    filled = []
    for place, p in last.before:
        if p is not None and _a_grad(place) and place.read() is None:
            filled.append((place, torch.zeros_like(place.obj)))
            place.write(filled[-1][1])
    return filled


def unfill_grads(filled: list, instrs) -> None:
    """After the recorded call: a filled .grad no op of the call used (its tensor got no
    gradient this time) is emptied again, as eager left it."""
    if not filled:
        return
    used = {
        a.id for ins in instrs if ins.code == OP for a in _refs((*ins.args, *ins.kwargs.values()))
    }
    for place, zeros in filled:
        if place.read() is zeros and zeros.gt_value_id not in used:
            place.write(None)


def _refs(args):
    for a in args:
        if type(a) is Ref:
            yield a
        elif type(a) in (list, tuple):
            yield from _refs(a)


def _key(p):
    """A slot's metadata key (None: empty, or not a worker tensor)."""
    return getattr(p, "gt_meta_key", None)


def _seen_now(now, was) -> str:
    if was is None:
        return "it holds a tensor; the recorded call found it empty"
    if now is None:
        return "it is empty; the recorded call found a tensor there"
    return "it holds a tensor of other metadata than the recorded call found"


def bound(entry) -> None:
    """Bound the replayed calls in flight: the worker reads every message at once, so a
    client far ahead would make its memory grow; past IN_FLIGHT calls, wait for it."""
    if entry.replayed % MARK_EVERY:
        return
    t = entry.session.transport
    window = IN_FLIGHT // MARK_EVERY
    entry.marks.append(t.post_mark(entry.marks[0] if len(entry.marks) >= window else None))
    while len(entry.marks) > window:
        t.wait_mark(entry.marks.popleft())
