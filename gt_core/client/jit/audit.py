"""An audit: a call that would replay is recorded instead, and compared with that replay.

jit's rules say what a replay may keep (frozen numbers, constants) and what flows (tensors,
settings); a rule no one foresaw would make a replay differ from the call's Python without a
word. So the first replay after each recipe, and then one in ``Options.jit_audit``, runs its
Python recorded, and the block it makes is compared with what the replay would have sent:
the same instructions, the same inputs read from the same places, the same numbers (those
frozen as recorded, those flowing as the replay computes them), the outputs left in the same
places. A difference stops replaying that key (refused, with what differed); the audited
call itself ran its Python, so its results are right either way.
"""

from __future__ import annotations

from gt_core.client.jit import replay
from gt_core.client.jit.recipe import Recipe
from gt_core.client.jit.recording import Refused, differ
from gt_core.observe.jit_states import JitReason, Trigger
from gt_core.stream.instructions import op_name

__all__ = ["due", "run", "compare"]


def due(entry) -> bool:
    """Whether this call is audited: the first replay of a recipe, then one in N."""
    n, every = entry.since_prepared, entry.session.options.jit_audit
    return n == 0 or (every > 0 and n % every == 0)


def run(entry, leaves, spec):
    """Record the call, compare it with the replay it stands for; its result."""
    r = entry.recipe
    would = replay.inputs(entry, leaves)  # (None: one no longer fits; the entry moved)
    scalars = list(entry.scalars_now)
    result, rec = entry.record(leaves, spec)
    if would is None:
        entry.keep(rec)
        return result
    entry.ran(audited=True)
    ops = {idx: op_name(op) for op, idx in entry.session.op_index.items()}
    what = compare(r, rec, would, scalars, ops)
    if what is None:
        entry.move(Trigger.AUDITED, audited=entry.audited)
    else:
        entry.move(Trigger.AUDIT_DIFFERED, JitReason("audit_differed", what=what))
    entry.keep(rec)
    return result


def compare(r: Recipe, rec, would: list, scalars: list, ops: dict) -> str | None:
    """What differs between the replay ``r`` would have sent (input ids ``would``, lifted
    numbers ``scalars``) and the block the recorded call ``rec`` made (None: nothing)."""
    why = rec.unreplayable() or rec.mutated
    if why is not None:
        return why.text()
    was, now = r.rec.shape(), rec.shape()
    if was != now:
        i = next((i for i, (a, b) in enumerate(zip(was, now, strict=False)) if a != b), None)
        if i is None:
            return f"the call made {len(now)} instructions, the replay sends {len(was)}"
        return f"instruction {i}: {_op(was[i], ops)} recorded, {_op(now[i], ops)} now"
    why = differ(r.rec, rec, ops)
    if why is not None:
        return why.text()
    # The numbers that flow in the recipe flow in the audited call too, changed or not.
    rec.flows_as(r.rec)
    try:
        fresh = Recipe(r.plan, rec)
    except Refused as exc:
        return exc.reason.text()
    values = {site: v for _, _, v, site in rec.floats()}
    lifted = set(r.scalar_sites)
    for k, site in enumerate(r.scalar_sites):
        if values.get(site) != scalars[k]:
            return f"a number that flows ({site}): {values.get(site)!r} made, {scalars[k]!r} sent"
    for i, where, v, site in r.rec.floats():
        if site not in lifted and values.get(site) != v:
            return (
                f"a number the replay keeps as recorded ({ops.get(i, i)} {where}): "
                f"{v!r} recorded, {values.get(site)!r} made"
            )
    for k, (a, b) in enumerate(zip(r.inputs, fresh.inputs, strict=True)):
        if _source(a[0], r) != _source(b[0], fresh) or a[1] != b[1]:
            return f"input {k}: read from {_said(a[0])}, the call read {_said(b[0])}"
        if not _constant(a[0], r) and would[k] != fresh.input_ids[k]:
            return f"input {k} ({_said(a[0])}): the replay would read another tensor"
    if [(id(x), n) for x, n in r.schedulers] != [(id(x), n) for x, n in rec.schedulers]:
        return "the call stepped other LR schedulers than the replay steps"
    if _outputs(r) != _outputs(fresh):
        return "the call left its outputs in other places than the replay would"
    return None


def _source(src, r: Recipe):
    """An input's source, comparable across recipes: an argument, a constant, or a place."""
    if type(src) is int:
        return ("argument", src)
    if src.obj is r.constants:
        return ("constant", src.key)
    return src.ident()


def _constant(src, r: Recipe) -> bool:
    return type(src) is not int and src.obj is r.constants


def _said(src) -> str:
    return f"argument {src}" if type(src) is int else src.describe()


def _outputs(r: Recipe) -> tuple:
    return (
        [(p.ident(), j) for p, j in r.placed],
        [p.ident() for p in r.cleared],
        [(k, m) for k, m in r.outputs],
        r.result,
        r.result_spec,
    )


def _op(shape: tuple, ops: dict) -> str:
    return str(ops.get(shape[1], shape[1])) if len(shape) > 1 else str(shape[0])
